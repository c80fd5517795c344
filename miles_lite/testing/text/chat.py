"""The text stand-in's ``POST /v1/chat/completions``: OpenAI requests in ``/generate`` terms.

:func:`chat_options` reads a request as SGLang 0.5.23 does (the sampling keys, the id
options, the 400s it gives; unknown keys are ignored); :class:`ChatEndpoint` renders the
conversation (:class:`~miles_lite.testing.text.templates.TemplateCache`), runs it as
``/generate`` runs a prompt (``n`` choices: one rid for ``n == 1``, random ones beyond)
and answers in the captures' shape (:mod:`.chat_answers`), whole or streamed.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from miles_lite.testing.text.chat_answers import (
    ChatOptions,
    chat_choice,
    chat_response,
    chat_stream_chunks,
)
from miles_lite.testing.text.generate import GenerateEndpoint, error_response, read_json, sse
from miles_lite.testing.text.scheduler import Call
from miles_lite.testing.text.validate import (
    BadRequest,
    ChatBadRequest,
    chat_error,
    check_length,
    check_sampling,
)

__all__ = ["ChatEndpoint", "ChatOptions", "chat_options"]

#: The id options SGLang refuses with ``stream: true``, in the order it checks them.
_ID_OPTIONS = ("return_prompt_token_ids", "return_token_ids", "return_meta_info")


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


class ChatEndpoint:
    """``/v1/chat/completions`` of one engine; generation is ``generate``'s."""

    def __init__(self, generate: GenerateEndpoint) -> None:
        self.generate = generate
        self.state = generate.state

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one ``POST /v1/chat/completions`` (the route's handler)."""
        state = self.state
        if state.warming():
            return error_response(503, "The server is not ready yet (warming up)")
        try:
            body = await read_json(request)
        except BadRequest as bad:
            return web.json_response(bad.payload, status=400)
        try:
            options = chat_options(body)
            state.log_request(body)
            state.stats.chat_requests += 1
            prompt = await state.templates.prompt_ids(body, state.tokenizing)
            params = check_sampling(options.sampling_params)
            check_length(len(prompt), params, state.config.context_length)
        except ChatBadRequest as bad:
            return web.json_response(bad.payload, status=400)
        except BadRequest as bad:
            return web.json_response(chat_error(bad), status=400)
        rid = options.rid or uuid.uuid4().hex
        # As SGLang: one rid for n == 1, random rids for the choices of n > 1.
        rids = [rid] if options.n == 1 else [uuid.uuid4().hex for _ in range(options.n)]
        if options.n > 1:
            rids[0] = rid
        # meta_info carries the log-prob triples only when the request asks for log-probs.
        generate_body = {"return_logprob": options.logprobs}
        calls = [(prompt, Call(r)) for r in rids]
        answers = await self.generate.run_all(calls, params, generate_body)
        if options.stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            chunks = chat_stream_chunks(rid, options, answers[0], state.tokenizer, len(prompt))
            for chunk in chunks:
                await response.write(sse(chunk))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        choices = [
            chat_choice(state.tokenizer, i, answer, prompt, options)
            for i, answer in enumerate(answers)
        ]
        # Compact, as SGLang writes its answers (orjson): no spaces.
        return web.json_response(
            chat_response(rid, options, choices, answers, len(prompt)), dumps=_compact
        )


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
