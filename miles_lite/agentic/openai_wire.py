"""The OpenAI side of the session server: error bodies, chunks, abort answers.

Pure functions over JSON and ``aiohttp.web`` responses, in the shapes OpenAI clients read.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from miles_lite._core import json as _json
from miles_lite.errors import EngineStatusError
from miles_lite.sglang.chat_wire import decode_chat_answer

__all__ = [
    "ChatAnswer",
    "abort_answer",
    "agent_answer",
    "as_chunk",
    "engine_answer",
    "error_response",
    "passthrough",
    "too_large",
]


@dataclass(frozen=True, slots=True)
class ChatAnswer:
    """A chat answer on its way to the agent: ``parsed``, the JSON value (read it, never
    change it; an engine's per-token lists in it may be :class:`msgspec.Raw`, which
    msgspec writes as they are), and ``raw``, the engine's own bytes when they are
    standard JSON, written to the agent as they are instead of encoding ``parsed`` again
    (the same JSON: the answer is passed on unchanged); None for an answer the server
    made (an ``abort``) or one with NaN/Infinity literals (encoded again, as null)."""

    parsed: Any
    raw: bytes | memoryview | None = None


def engine_answer(data: bytes | memoryview) -> ChatAnswer:
    """The engine's chat answer read from its bytes, decoded once, each choice's per-token
    lists kept as their JSON text (:func:`~miles_lite.sglang.chat_wire.decode_chat_answer`);
    ``ValueError`` when it is not JSON. What the values mean is the caller's to check."""
    try:
        return ChatAnswer(decode_chat_answer(data), data)
    except ValueError:  # NaN/Infinity literals (Python's json writes them): not passed on
        return ChatAnswer(_json.loads(data))


#: What the session server asks the engine for itself, for the turn's record: each
#: choice's field, and the key of the agent's body that asks for it. An agent's answer
#: keeps a field only if the agent asked for it too.
_RECORD_FIELDS = (
    ("logprobs", "logprobs"),
    ("prompt_token_ids", "return_prompt_token_ids"),
    ("meta_info", "return_meta_info"),
)


def agent_answer(answer: ChatAnswer, body: Mapping[str, Any]) -> ChatAnswer:
    """``answer`` as the agent's ``body`` asked for it: each choice without what the
    server asked the engine for its record and the agent did not ask for (``logprobs``
    null, no ``prompt_token_ids``, no ``meta_info``): an OpenAI answer, which the agent
    parses in a fraction of the time (the per-token lists are most of its bytes).
    ``answer`` itself, its bytes passed on as they are, when the agent asked for all of
    them or the answer has no choices to trim."""
    dropped = [field for field, key in _RECORD_FIELDS if body.get(key) is not True]
    parsed = answer.parsed
    choices = parsed.get("choices") if dropped and isinstance(parsed, dict) else None
    if not isinstance(choices, list):
        return answer
    trimmed = []
    for choice in choices:
        if isinstance(choice, dict):
            choice = {k: v for k, v in choice.items() if k not in dropped}
            if "logprobs" in dropped:
                choice["logprobs"] = None
        trimmed.append(choice)
    return ChatAnswer({**parsed, "choices": trimmed})


def as_chunk(answer: dict[str, Any]) -> dict[str, Any]:
    choices = []
    for choice in answer.get("choices", []):
        message = dict(choice.get("message") or {})
        tool_calls = message.get("tool_calls")
        if tool_calls:
            message["tool_calls"] = [{**call, "index": i} for i, call in enumerate(tool_calls)]
        choices.append(
            {
                "index": choice.get("index", 0),
                "delta": message,
                "logprobs": choice.get("logprobs"),
                "finish_reason": choice.get("finish_reason"),
            }
        )
    chunk = {k: v for k, v in answer.items() if k != "choices"}
    chunk.update(object="chat.completion.chunk", choices=choices)
    return chunk


def abort_answer(model: str) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": "abort",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def error_response(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> web.Response:
    payload = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(payload, status=status)


def too_large(size: int | None, limit: int) -> web.Response:
    got = f"{size} bytes" if size is not None else "more"
    return error_response(
        413,
        f"request body is {got}, over the session server's limit of {limit} bytes; send less "
        "history or raise SessionServerConfig.max_body_bytes",
    )


def passthrough(exc: EngineStatusError) -> web.Response:
    """A non-2xx engine answer, passed to the agent with its status."""
    try:
        payload = json.loads(exc.body_excerpt)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return web.json_response(payload, status=exc.status)
    message = payload.get("message") if isinstance(payload, dict) else None
    text = message if isinstance(message, str) else exc.body_excerpt
    return error_response(
        exc.status, f"engine {exc.url} answered HTTP {exc.status}: {text}", "upstream_error"
    )
