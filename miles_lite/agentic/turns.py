"""What the session server sends the engine for an agent's chat request, and how a turn
extends the session so far. Pure: no I/O.

An agent is not trusted with the rollout's policy: only the chat keys of
:data:`ALLOWED_KEYS` pass (anything else is refused with the key named), the rollout's
sampling wins for the on-policy keys (an agent's ``max_tokens`` may only lower the
budget), ``n`` must be 1, ``stream`` a bool, and images come as data URLs only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from miles_lite.sglang.sampling import CHAT_NAMES

__all__ = [
    "ALLOWED_KEYS",
    "ON_POLICY",
    "BadTurn",
    "Trajectory",
    "appended_messages",
    "engine_payload",
    "merged_extra_body",
    "prefix_len",
    "render_key",
]

#: Chat keys an agent may send. Sampling keys among them are the rollout's to set.
ALLOWED_KEYS = frozenset(
    {
        "messages",
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "max_new_tokens",
        "stream",
        "stream_options",
        "n",
        "user",
        "logprobs",
        "top_logprobs",
        "return_prompt_token_ids",
        "return_meta_info",
        "response_format",
        "chat_template_kwargs",
        "separate_reasoning",
        *CHAT_NAMES.values(),
    }
)
#: Keys the session server sets itself: an agent's value is replaced.
_SERVER_KEYS = ("logprobs", "top_logprobs", "return_prompt_token_ids", "return_meta_info")
#: Chat keys that change the distribution the tokens are drawn from: only the rollout
#: sets them (an agent's value is dropped when the rollout sets none), so recorded turns
#: are on-policy data. Stop sequences, seeds and a lower budget only cut or replay it.
ON_POLICY = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "min_tokens",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "logit_bias",
    }
)


class BadTurn(Exception):
    """An agent's request the server refuses: ``param`` names the field (OpenAI's error
    shape), ``message`` says what to do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def merged_extra_body(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with its ``extra_body`` object merged in at the top, as the ``openai``
    client sends it (its keys win): a plain-HTTP agent may spread the ``request_kwargs``
    it was handed (shaped for that client) into its JSON body as they are. Raises
    :class:`BadTurn` for an ``extra_body`` that is not an object."""
    if "extra_body" not in body:
        return body
    extra = body["extra_body"]
    merged = {k: v for k, v in body.items() if k != "extra_body"}
    if extra is None:
        return merged
    if not isinstance(extra, dict):
        raise BadTurn(
            f"extra_body must be an object (merged into the body, as the openai client"
            f" does), got {type(extra).__name__}",
            "extra_body",
        )
    merged.update(extra)
    return merged


def engine_payload(
    body: Mapping[str, Any], sampling: Mapping[str, Any], *, rid: str
) -> dict[str, Any]:
    """The engine's chat request for an agent's ``body``, under the rollout's ``sampling``
    in chat names (:func:`~miles_lite.sglang.sampling.chat_sampling`). Raises
    :class:`BadTurn` naming a field the agent may not send or sends wrong."""
    unknown = sorted(body.keys() - ALLOWED_KEYS)
    if unknown:
        raise BadTurn(
            f"{unknown[0]!r} is not accepted here: a rollout's chat turns take the OpenAI chat"
            f" keys ({', '.join(sorted(ALLOWED_KEYS))}); the rollout sets the sampling",
            unknown[0],
        )
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise BadTurn(f"n must be 1, got {n!r}: one session is one trajectory", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadTurn(f"stream must be true or false, got {stream!r}", "stream")
    _check_images(body.get("messages"))
    payload = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    budget = _budget(body, sampling)
    for key in ("max_new_tokens", "max_completion_tokens"):
        payload.pop(key, None)
    # On-policy: the rollout's sampling, whatever the agent asked.
    for name in ON_POLICY:
        payload.pop(name, None)
    payload.update((name, value) for name, value in sampling.items() if name != "max_tokens")
    if budget is not None:
        payload["max_tokens"] = budget
    for key in _SERVER_KEYS:
        payload.pop(key, None)
    # TITO: ids and log-probs of this turn only; logprob_start_len=0 would make the engine
    # compute prompt log-probs too (costly, and never used).
    payload.pop("logprob_start_len", None)
    payload.update(
        logprobs=True, return_prompt_token_ids=True, return_meta_info=True, rid=rid, stream=False
    )
    return payload


def _budget(body: Mapping[str, Any], sampling: Mapping[str, Any]) -> int | None:
    """The turn's output budget: the rollout's, lowered (never raised) by the agent's."""
    rollout = sampling.get("max_tokens")
    asked = None
    for key in ("max_completion_tokens", "max_tokens", "max_new_tokens"):
        value = body.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadTurn(f"{key} must be an int >= 1, got {value!r}", key)
            asked = value if asked is None else min(asked, value)
    if asked is None:
        return rollout if isinstance(rollout, int) else None
    return asked if not isinstance(rollout, int) else min(asked, rollout)


def _check_images(messages: Any) -> None:
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url.startswith("data:"):
                raise BadTurn(
                    f"messages[{i}] has an image_url that is not a data URL: the engine"
                    " would fetch it; send the image inline (data:image/...;base64,...)",
                    "messages",
                )


def appended_messages(
    previous: list[dict[str, Any]], answer: Mapping[str, Any], messages: list[Any]
) -> list[dict[str, Any]] | None:
    """The messages an agent appended to its last turn, or None when it changed history.

    ``previous`` is the last request's messages and ``answer`` the assistant message the
    engine gave; ``messages`` extends them when it starts with ``previous`` unchanged,
    then that answer (content and tool calls as the agent's client echoes them).
    """
    n = len(previous)
    if len(messages) <= n or messages[:n] != previous:
        return None
    if _assistant_key(messages[n]) != _assistant_key(answer):
        return None
    appended = messages[n + 1 :]
    return appended if all(isinstance(m, dict) for m in appended) else None


def _assistant_key(message: Any) -> tuple[Any, ...] | None:
    """What of an assistant message the model wrote: its text and tool calls (names and
    arguments), whatever ids and empty fields the agent's client adds or drops."""
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return None
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            return None
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        calls.append((function.get("name"), json.dumps(arguments, sort_keys=True)))
    return (message.get("content") or "", tuple(calls))


def prefix_len(trajectory: list[int], prompt: list[int], max_trim: int) -> int:
    """How much of ``trajectory`` the ``prompt`` starts with: all of it, or all less up to
    ``max_trim`` trailing tokens (stop tokens a template re-renders otherwise); 0 when it
    does not extend it. One slice compare at C speed in the usual case."""
    n = len(trajectory)
    if n <= len(prompt) and prompt[:n] == trajectory:
        return n
    for trim in range(1, min(max_trim, n - 1) + 1):
        head = n - trim
        if head <= len(prompt) and prompt[:head] == trajectory[:head]:
            return head
    return 0


@dataclass
class Trajectory:
    """What token in needs of a session: the ids so far (the last prompt and output),
    the messages that made them with the assistant message the engine returned, the
    tools and template options they were rendered with, and whether the model ended its
    turn with its end-of-turn token."""

    ids: list[int]
    messages: list[dict[str, Any]]
    answer: dict[str, Any]
    render_key: str
    turn_ended: bool


def render_key(body: Mapping[str, Any]) -> str:
    """What besides the messages shapes a rendering: tools and template options."""
    tools, kwargs = body.get("tools"), body.get("chat_template_kwargs")
    if tools is None and kwargs is None:  # most turns: no JSON to write
        return _PLAIN_RENDER_KEY
    return json.dumps([tools, kwargs], sort_keys=True)


#: The render key of a request with neither tools nor template options.
_PLAIN_RENDER_KEY = json.dumps([None, None])
