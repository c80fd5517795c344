"""The OpenAI side of the text stand-in: ``/v1/chat/completions`` requests and answers.

Pure functions over JSON, shaped as SGLang 0.5.23 answers (``tests/data/sglang_captures``
``chat_*.json``): :func:`chat_options` reads a request into ``/generate`` terms (the
sampling keys, the id options, the 400s SGLang gives), :class:`TemplateCache` renders
``messages`` with the tokenizer's chat template once per distinct conversation, and
:func:`chat_choice` / :func:`chat_response` build the answer from a ``/generate`` answer.
Tool calls are parsed as SGLang's ``qwen25`` parser does (``<tool_call>{json}</tool_call>``
blocks) when the request has ``tools``; the choice then ends with ``tool_calls``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from miles_lite.testing.text.policy import fast_decode, fast_encode

__all__ = [
    "ChatBadRequest",
    "ChatOptions",
    "TemplateCache",
    "chat_choice",
    "chat_options",
    "chat_response",
    "chat_stream_chunks",
    "parse_tool_calls",
]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
#: The id options SGLang refuses with ``stream: true``, in the order it checks them.
_ID_OPTIONS = ("return_prompt_token_ids", "return_token_ids", "return_meta_info")
_FINISH = {"length": "length", "stop": "stop", "abort": "abort"}


class ChatBadRequest(Exception):
    """A request SGLang answers with 400; ``payload`` is its JSON error body."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.payload = {
            "object": "error",
            "message": message,
            "type": "BadRequest",
            "param": None,
            "code": 400,
        }


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    """A chat request in ``/generate`` terms."""

    sampling_params: dict[str, Any]
    rid: str | None
    n: int
    model: str
    stream: bool
    logprobs: bool
    top_logprobs: int
    return_prompt_token_ids: bool
    return_token_ids: bool
    return_meta_info: bool
    has_tools: bool


def _bool(body: dict[str, Any], key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ChatBadRequest(f"1 validation error: {key}: Input should be a valid boolean")
    return value


def chat_options(body: Any) -> ChatOptions:
    """Read a ``/v1/chat/completions`` body; raises :class:`ChatBadRequest` as SGLang does.

    Unknown keys are ignored, as SGLang ignores them.
    """
    if not isinstance(body, dict):
        raise ChatBadRequest("1 validation error: Input should be a valid dictionary")
    messages = body.get("messages")
    if "input_ids" not in body and (not isinstance(messages, list) or not messages):
        raise ChatBadRequest("1 validation error: messages: Field required")
    stream = bool(_bool(body, "stream"))
    flags = {key: bool(_bool(body, key)) for key in _ID_OPTIONS}
    if stream:
        for key in _ID_OPTIONS:
            if flags[key]:
                raise ChatBadRequest(
                    f"{key} is not supported with streaming. "
                    f"Please set stream=false when using {key}=true."
                )
    params: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        params["max_new_tokens"] = _int(max_tokens, "max_tokens")
    for chat_key, key in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("frequency_penalty", "frequency_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("repetition_penalty", "repetition_penalty"),
    ):
        value = body.get(chat_key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ChatBadRequest(f"1 validation error: {chat_key}: Input should be a number")
            params[key] = value
    for chat_key, key in (
        ("top_k", "top_k"),
        ("min_tokens", "min_new_tokens"),
        ("seed", "sampling_seed"),
    ):
        value = body.get(chat_key)
        if value is not None:
            params[key] = _int(value, chat_key)
    for key in ("ignore_eos", "no_stop_trim", "skip_special_tokens"):
        value = _bool(body, key)
        if value is not None:
            params[key] = value
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ChatBadRequest("1 validation error: stop: Input should be a string or a list")
        params["stop"] = stop
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in stop_ids
        ):
            raise ChatBadRequest("1 validation error: stop_token_ids: Input should be a list")
        params["stop_token_ids"] = stop_ids
    n = body.get("n")
    n = 1 if n is None else _int(n, "n")
    if n < 1:
        raise ChatBadRequest("1 validation error: n: Input should be greater than or equal to 1")
    top_logprobs = body.get("top_logprobs")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ChatBadRequest("1 validation error: rid: Input should be a valid string")
    model = body.get("model")
    return ChatOptions(
        sampling_params=params,
        rid=rid,
        n=n,
        model=model if isinstance(model, str) else "default",
        stream=stream,
        logprobs=bool(_bool(body, "logprobs")),
        top_logprobs=0 if top_logprobs is None else _int(top_logprobs, "top_logprobs"),
        return_prompt_token_ids=flags["return_prompt_token_ids"],
        return_token_ids=flags["return_token_ids"],
        return_meta_info=flags["return_meta_info"],
        has_tools=bool(body.get("tools")),
    )


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChatBadRequest(f"1 validation error: {key}: Input should be a valid integer")
    return value


class TemplateCache:
    """Chat-template renders, kept by conversation (LRU, ``size`` entries).

    Rendering the Qwen3 template costs about a millisecond per short conversation; a
    benchmark sends the same few conversations thousands of times.
    """

    def __init__(self, tokenizer: Any, size: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self.hits = 0
        self._cache: OrderedDict[str, list[int]] = OrderedDict()

    async def prompt_ids(self, body: dict[str, Any], limiter: Any = None) -> list[int]:
        """The templated prompt of a chat body (its ``input_ids`` when it gives them).

        A render that is not cached runs in a worker thread (``limiter``, an anyio
        CapacityLimiter, bounds them): a long conversation takes longer to render and
        encode than an event-loop step may.
        """
        ids = body.get("input_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ChatBadRequest("1 validation error: input_ids: Input should be a list")
            return list(ids)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ChatBadRequest(
                "1 validation error: chat_template_kwargs: Input should be a valid dictionary"
            )
        key = json.dumps([body["messages"], body.get("tools"), kwargs], sort_keys=True)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        messages = _normalized(body["messages"])
        rendered: list[int] = await anyio.to_thread.run_sync(
            self._render, messages, body.get("tools") or None, kwargs, limiter=limiter
        )
        self._cache[key] = rendered
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return rendered

    def _render(self, messages: list[Any], tools: Any, kwargs: dict[str, Any]) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja errors, a bad message, ...
            raise ChatBadRequest(f"cannot apply the chat template: {exc}") from exc
        return fast_encode(self.tokenizer, text)


def _normalized(messages: list[Any]) -> list[Any]:
    # The Qwen3 template iterates tool_call.arguments as a mapping when it is not a
    # string; OpenAI clients send a JSON string, which the template embeds as is.
    out = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ChatBadRequest("1 validation error: messages: each needs a role")
        if message.get("content") is None and message["role"] == "assistant":
            message = {**message, "content": ""}
        out.append(message)
    return out


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``(normal text, tool calls)`` of a model answer, as SGLang's qwen25 parser gives
    them; a block whose JSON does not parse stays in the text (SGLang keeps it too)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "index": len(calls),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls


def _token_entry(tokenizer: Any, token: int, logprob: float, top: bool) -> dict[str, Any]:
    text = fast_decode(tokenizer, [token], skip_special_tokens=False)
    raw = list(text.encode("utf-8", errors="replace"))
    entry: dict[str, Any] = {"token": text, "bytes": raw, "logprob": logprob, "top_logprobs": []}
    if top:
        entry["top_logprobs"] = [{"token": text, "bytes": raw, "logprob": logprob}]
    return entry


def _answer_parts(
    tokenizer: Any, answer: dict[str, Any], options: ChatOptions
) -> tuple[str, list[dict[str, Any]], str, dict[str, Any] | None, Any]:
    """What a chat answer and its stream share, from a ``/generate`` answer: the text, the
    tool calls parsed out of it, the finish reason (``tool_calls`` when it stopped on
    one), the OpenAI log-probs (when asked for) and the matched stop."""
    meta = answer["meta_info"]
    finish = meta["finish_reason"] or {}
    text = answer["text"]
    tool_calls: list[dict[str, Any]] = []
    if options.has_tools:
        text, tool_calls = parse_tool_calls(text)
    reason = _FINISH.get(finish.get("type", ""), "stop")
    if tool_calls and reason == "stop":
        reason = "tool_calls"
    logprobs = None
    if options.logprobs:
        logprobs = {
            "content": [
                _token_entry(tokenizer, token, lp, options.top_logprobs > 0)
                for lp, token, _ in meta.get("output_token_logprobs", [])
            ]
        }
    matched = finish.get("matched") if finish.get("type") == "stop" else None
    return text, tool_calls, reason, logprobs, matched


def chat_choice(
    tokenizer: Any,
    index: int,
    answer: dict[str, Any],
    prompt: Sequence[int],
    options: ChatOptions,
) -> dict[str, Any]:
    """One ``choices[i]`` from a ``/generate`` answer (its ``meta_info`` with log-probs)."""
    text, tool_calls, reason, logprobs, matched = _answer_parts(tokenizer, answer, options)
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": reason,
        "matched_stop": matched,
    }
    if options.return_meta_info:
        choice["meta_info"] = answer["meta_info"]
    if options.return_prompt_token_ids or options.return_token_ids:
        choice["prompt_token_ids"] = list(prompt)
    if options.return_token_ids:
        choice["response_token_ids"] = answer["output_ids"]
    return choice


def chat_response(
    rid: str,
    options: ChatOptions,
    choices: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    prompt_tokens: int,
) -> dict[str, Any]:
    """The whole ``chat.completion`` answer; ``metadata`` is the first answer's versions."""
    completion = sum(a["meta_info"]["completion_tokens"] for a in answers)
    first = answers[0]["meta_info"]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": options.model,
        "choices": choices,
        "usage": _usage(prompt_tokens, completion),
        "metadata": {
            "weight_version": first["weight_version"],
            "weight_versions": first["weight_versions"],
        },
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def chat_stream_chunks(
    rid: str, options: ChatOptions, answer: dict[str, Any], tokenizer: Any, prompt_tokens: int
) -> list[dict[str, Any]]:
    """The SSE chunks of a streamed chat answer, in captures/chat_stream.txt's order: the
    role, the content, the finish reason, the usage (then ``[DONE]``, sent by the caller)."""
    created = int(time.time())
    head = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": options.model,
    }
    text, tool_calls, reason, logprobs, matched = _answer_parts(tokenizer, answer, options)
    delta: dict[str, Any] = {"reasoning_content": None, "content": text}
    if tool_calls:
        delta["tool_calls"] = tool_calls

    def chunk(delta: dict[str, Any], logprobs: Any, reason: str | None) -> dict[str, Any]:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": reason,
            "matched_stop": matched if reason else None,
        }
        return {**head, "choices": [choice]}

    return [
        chunk({"reasoning_content": None, "role": "assistant", "content": ""}, None, None),
        chunk(delta, logprobs, None),
        chunk({"reasoning_content": None}, None, reason),
        {
            **head,
            "choices": [],
            "usage": _usage(prompt_tokens, answer["meta_info"]["completion_tokens"]),
        },
    ]
