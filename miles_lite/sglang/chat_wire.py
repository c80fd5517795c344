"""SGLang's ``/v1/chat/completions`` answers read into turn records (TITO): the ids and
log-probs the engine returned, checked by the one triple parser of
:mod:`miles_lite.sglang.generate_wire`. Pure, no I/O."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.generate_wire import FINISH_STATUS, parse_output_tokens, parse_weight_spans
from miles_lite.types import WeightSpan

__all__ = ["TurnRecord", "record_from_choice"]


@dataclass(frozen=True, kw_only=True)
class TurnRecord:
    """One recorded chat turn of a session.

    ``prompt_ids`` is the prompt the engine ran, after its first ``prefix_len`` tokens:
    those are the session's trajectory before this turn (the previous turn's prompt and
    output, less a trimmed trailing token or two), so a session keeps each turn's new
    tokens only, not its whole history again; ``prefix_len`` 0: ``prompt_ids`` is the
    whole prompt (the first turn, or one that rewrote the history).
    ``output_ids`` / ``output_log_probs`` are what it generated (one log-prob per id),
    ``weight_spans`` which weight version made which of them (tokens made on KV from
    before an update marked), ``cached_tokens`` the prompt tokens the engine found cached,
    ``finish_reason`` the OpenAI string (``stop``, ``tool_calls``, ``length``, ``abort``).
    ``request`` is the body forwarded to the engine without ``messages`` / ``tools`` /
    ``input_ids`` (their counts instead) and ``response`` the engine's answer without
    per-token lists, kept for debugging (``GET /sessions/<id>``).
    """

    rid: str
    engine_url: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str
    weight_version: str | None = None
    weight_spans: tuple[WeightSpan, ...] = ()
    cached_tokens: int = 0
    prefix_len: int = 0
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON (for ``GET /sessions/<id>``)."""
        return {
            "rid": self.rid,
            "engine_url": self.engine_url,
            "prefix_len": self.prefix_len,
            "prompt_token_ids": self.prompt_ids,
            "output_token_ids": self.output_ids,
            "output_log_probs": self.output_log_probs,
            "finish_reason": self.finish_reason,
            "weight_version": self.weight_version,
            "request": self.request,
            "response": self.response,
        }


def record_from_choice(
    answer: Any,
    *,
    rid: str,
    engine_url: str,
    request: dict[str, Any],
    vocab_size: int | None = None,
) -> TurnRecord:
    """Read the only choice of an engine's chat answer into a :class:`TurnRecord`.

    Needs ``prompt_token_ids`` (ints, not empty) and ``meta_info.output_token_logprobs``
    (``[logprob, id, text]`` triples, one per output token, as SGLang 0.5.23 returns them
    with ``return_prompt_token_ids`` / ``return_meta_info``), checked as ``/generate``
    answers are (finite log-probs <= 0, int ids in the vocabulary, an echoed
    ``meta_info.id`` that is ``rid``), a known ``finish_reason``, a ``completion_tokens``
    equal to the output's length, and no more output tokens than the request's
    ``max_tokens``. Raises :class:`EngineProtocolError` naming what is wrong.
    """
    where = {"url": engine_url, "request_id": rid}
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise EngineProtocolError("chat answer has no 'choices' list", **where)
    if len(answer["choices"]) != 1 or not isinstance(answer["choices"][0], dict):
        raise EngineProtocolError(
            f"chat answer has {len(answer['choices'])} choices; one was asked for", **where
        )
    choice = answer["choices"][0]
    prompt_ids = _prompt_ids(choice.get("prompt_token_ids"), vocab_size, where)
    meta = choice.get("meta_info")
    if not isinstance(meta, dict):
        raise EngineProtocolError(
            "chat answer lacks choices[0].meta_info; the engine must honour return_meta_info",
            **where,
        )
    ids, log_probs = parse_output_tokens(meta, rid, where, vocab_size=vocab_size)
    budget = request.get("max_tokens")
    if isinstance(budget, int) and len(ids) > budget:
        raise EngineProtocolError(
            f"chat answer has {len(ids)} output tokens for a turn of max_tokens={budget}",
            **where,
        )
    finish = choice.get("finish_reason")
    if not isinstance(finish, str) or finish not in FINISH_STATUS:
        raise EngineProtocolError(f"chat answer has finish_reason {finish!r}", **where)
    completion = meta.get("completion_tokens")
    usage = answer.get("usage")
    if completion is None and isinstance(usage, dict):
        completion = usage.get("completion_tokens")
    if completion is not None and completion != len(ids):
        raise EngineProtocolError(
            f"chat answer counts {completion!r} completion tokens for {len(ids)} output ids",
            **where,
        )
    spans = parse_weight_spans(meta, len(ids), where)
    cached = meta.get("cached_tokens", 0)
    if isinstance(cached, bool) or not isinstance(cached, int) or cached < 0:
        raise EngineProtocolError(
            f"meta_info.cached_tokens is {cached!r}, not an int >= 0", **where
        )
    return TurnRecord(
        rid=rid,
        engine_url=engine_url,
        prompt_ids=prompt_ids,
        output_ids=ids,
        output_log_probs=log_probs,
        finish_reason=finish,
        weight_version=spans[-1].version if spans else None,
        weight_spans=spans,
        cached_tokens=cached,
        request=_slim_request(request),
        response=_slim_response(answer),
    )


def _prompt_ids(
    prompt_ids: Any, vocab_size: int | None, where: Mapping[str, str | None]
) -> list[int]:
    """The answer's ``prompt_token_ids``, checked: a non-empty list of ints (not bools,
    not floats) in ``[0, vocab_size)``. A turn's prompt is its whole history, so the check
    runs at C speed (msgspec, ~10 ns an id; Python's scans took ~50); a list that fails
    it is looked at again to say why."""
    if isinstance(prompt_ids, list) and prompt_ids:
        try:
            checked: list[int] = msgspec.convert(prompt_ids, _ids_type(vocab_size))
            return checked
        except msgspec.ValidationError:
            pass
    if (
        not isinstance(prompt_ids, list)
        or not prompt_ids
        or not all(type(i) is int for i in prompt_ids)
    ):
        raise EngineProtocolError(
            "chat answer lacks choices[0].prompt_token_ids (a non-empty list of ids); the "
            "engine must honour return_prompt_token_ids (SGLang >= 0.5.23)",
            **where,
        )
    raise EngineProtocolError(
        f"chat answer's prompt_token_ids hold ids outside [0, {vocab_size})", **where
    )


@functools.lru_cache(maxsize=16)
def _ids_type(vocab_size: int | None) -> Any:
    """``list[int]`` of ids in ``[0, vocab_size)``, for msgspec (one per vocabulary)."""
    bounds = msgspec.Meta(ge=0) if vocab_size is None else msgspec.Meta(ge=0, lt=vocab_size)
    return list[Annotated[int, bounds]]


def _slim_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request without its history: every turn resends the whole conversation, so
    keeping it would make a session's records grow with the square of its turns."""
    slim = {k: v for k, v in request.items() if k not in ("messages", "tools", "input_ids")}
    messages = request.get("messages")
    slim["num_messages"] = len(messages) if isinstance(messages, list) else 0
    slim["num_tools"] = len(request.get("tools") or [])
    if "input_ids" in request:
        slim["num_input_ids"] = len(request["input_ids"])
    return slim


def _slim_response(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without per-token lists, which the record holds as ids and log-probs."""
    slim = dict(answer)
    choices = []
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        choice = {k: v for k, v in choice.items() if k not in ("logprobs", "prompt_token_ids")}
        meta = choice.get("meta_info")
        if isinstance(meta, dict):
            choice["meta_info"] = {
                k: v
                for k, v in meta.items()
                if k not in ("output_token_logprobs", "input_token_logprobs")
            }
        choices.append(choice)
    slim["choices"] = choices
    return slim
