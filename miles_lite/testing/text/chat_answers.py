"""The OpenAI answers of the text stand-in's ``/v1/chat/completions``, from ``/generate`` answers.

Pure functions over JSON, shaped as SGLang 0.5.23 answers (``tests/data/sglang_captures``
``chat_*.json``, ``chat_stream.txt``): :func:`chat_choice` and :func:`chat_response`
build a whole answer, :func:`chat_stream_chunks` a streamed one. With ``tools`` in the
request, tool calls are parsed out of the text (:func:`~miles_lite.testing.text.tools.parse_tool_calls`)
and a choice that stopped on one ends with ``tool_calls``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miles_lite.testing.text.tools import parse_tool_calls
from miles_lite.testing.tokenizers import fast_decode

__all__ = ["ChatOptions", "chat_choice", "chat_response", "chat_stream_chunks"]

_FINISH = {"length": "length", "stop": "stop", "abort": "abort"}


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
