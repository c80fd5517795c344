"""The session server's HTTP edge: an agent's request body in (JSON only, bounded in size,
time and nesting), the answer out (JSON, or one server-sent-events chunk), and
:class:`Refused`, the early answer a handler raises, with the counter it counts in."""

from __future__ import annotations

from typing import Any

import anyio
from aiohttp import web

from miles_lite._core import json as _json
from miles_lite.agentic.config import RefusalCounter
from miles_lite.agentic.messages_wire import messages_error
from miles_lite.agentic.openai_wire import ChatAnswer, as_chunk, error_response, too_large

__all__ = [
    "OFF_LOOP_JSON_BYTES",
    "Refused",
    "bearer",
    "messages_refusal",
    "read_chat_body",
    "refuse",
    "write_answer",
]

#: JSON larger than this (an agent's body, an engine's answer) is parsed in a worker
#: thread, not on the event loop.
OFF_LOOP_JSON_BYTES = 64 * 1024


class Refused(Exception):
    """An answer that ends a request early (an error for the agent, an abort), and the
    name of the server's counter it counts in (``None``: counted elsewhere)."""

    def __init__(self, response: web.StreamResponse, counter: RefusalCounter | None) -> None:
        super().__init__(response.status)
        self.response = response
        self.counter = counter


def refuse(
    status: int,
    message: str,
    counter: RefusalCounter,
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> Refused:
    """A :class:`Refused` with an OpenAI error body."""
    return Refused(error_response(status, message, kind, param), counter)


def messages_refusal(response: web.StreamResponse) -> web.StreamResponse:
    """An early answer with an OpenAI error body, in Anthropic Messages' error shape (same
    status); anything else as it is."""
    body = getattr(response, "body", None)
    if not isinstance(body, bytes | bytearray):
        return response
    try:
        error = _json.loads(body)
    except ValueError:
        return response
    return web.json_response(messages_error(error), status=response.status)


def bearer(request: web.Request) -> str:
    """The ``Authorization: Bearer`` token, or ``""``."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


async def read_chat_body(request: web.Request, *, max_bytes: int, timeout_s: float) -> Any:
    """An agent's chat body: a JSON object with a non-empty ``messages`` list. Raises
    :class:`Refused`: 415 for another content type, 413 over ``max_bytes``, 408 when it does
    not arrive within ``timeout_s``, 400 for what is not standard JSON (NaN, nesting too
    deep) or not that object."""
    if request.content_type != "application/json":
        raise refuse(
            415, f"Content-Type {request.content_type!r}: send application/json", "refused"
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise Refused(too_large(request.content_length, max_bytes), "too_large")
    try:
        if request.content.is_eof():  # all of it is in already: nothing to time
            raw = await request.read()
        else:
            with anyio.fail_after(timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Refused(too_large(None, max_bytes), "too_large") from None
    except TimeoutError:
        raise refuse(
            408, f"the request body did not arrive within {timeout_s} s", "refused"
        ) from None
    try:
        if len(raw) > OFF_LOOP_JSON_BYTES:
            body = await anyio.to_thread.run_sync(_json.loads_strict, raw)
        else:
            body = _json.loads_strict(raw)
    except ValueError as exc:
        raise refuse(
            400, f"request body is not JSON ({exc}); send a chat.completions body", "refused"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise refuse(
            400,
            "request body must be a JSON object with a 'messages' list",
            "refused",
            param="messages",
        )
    if not body["messages"]:
        raise refuse(
            400, "'messages' is empty; send at least one message", "refused", param="messages"
        )
    return body


async def write_answer(
    request: web.Request, answer: ChatAnswer, stream: bool, large: bool = False
) -> web.StreamResponse:
    """The answer as JSON (the engine's own bytes where it has them: nothing to encode),
    or (``stream``) as one chunk then ``[DONE]``: ids and log-probs need the whole answer,
    which SGLang does not stream (as miles). ``large``: encode the chunk in a worker
    thread (thousands of per-token log-prob entries take tens of ms)."""
    raw = answer.raw
    if not stream and raw is not None:
        return web.Response(
            body=raw if isinstance(raw, bytes) else bytes(raw), content_type="application/json"
        )
    payload = as_chunk(answer.parsed) if stream else answer.parsed
    if large:
        text = await anyio.to_thread.run_sync(lambda: _json.dumps(payload, strict=False))
    else:
        text = _json.dumps(payload, strict=False)
    if not stream:
        return web.Response(body=text, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: " + text + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
