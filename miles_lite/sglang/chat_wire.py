"""SGLang's ``/v1/chat/completions`` answers decoded (:func:`decode_chat_answer`) and read
into turn records (TITO): the ids and log-probs the engine returned, checked by the one
triple parser of :mod:`miles_lite.sglang.generate_wire`. Pure, no I/O.

A session server asks the engine for everything its record needs (``logprobs``,
``return_prompt_token_ids``, ``return_meta_info``), and SGLang then answers with three
per-token lists in each choice: ``logprobs.content`` (about 150 bytes a token),
``prompt_token_ids`` (the turn's whole history) and ``response_token_ids``. The record
reads the output from ``meta_info`` and needs the prompt only to check it is the one
sent, so :func:`decode_chat_answer` keeps those three as their JSON text
(:class:`msgspec.Raw`) instead of making a Python object per token and entry."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from miles_lite._core import json as _json
from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.generate_wire import FINISH_STATUS, parse_output_tokens, parse_weight_spans
from miles_lite.types import WeightSpan

__all__ = ["PER_TOKEN_FIELDS", "TurnRecord", "decode_chat_answer", "record_from_choice"]


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


#: A choice's per-token lists, kept as their JSON text by :func:`decode_chat_answer`
#: (and left out of a record's ``response``).
PER_TOKEN_FIELDS = ("logprobs", "prompt_token_ids", "response_token_ids")

_ABSENT = msgspec.Raw()  # a field the answer does not have (a present one is never empty)


class _Choice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A choice as SGLang 0.5.23 writes it (``captures/chat_lp_ids.json``,
    ``chat_meta_sglext_n2.json``); any other key sends the answer to the general parser."""

    index: Any = msgspec.UNSET
    message: Any = msgspec.UNSET
    logprobs: msgspec.Raw = _ABSENT
    finish_reason: Any = msgspec.UNSET
    matched_stop: Any = msgspec.UNSET
    prompt_token_ids: msgspec.Raw = _ABSENT
    response_token_ids: msgspec.Raw = _ABSENT
    meta_info: Any = msgspec.UNSET
    hidden_states: Any = msgspec.UNSET


class _Answer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: Any = msgspec.UNSET
    object: Any = msgspec.UNSET
    created: Any = msgspec.UNSET
    model: Any = msgspec.UNSET
    choices: list[_Choice]
    usage: Any = msgspec.UNSET
    metadata: Any = msgspec.UNSET
    sglext: Any = msgspec.UNSET
    system_fingerprint: Any = msgspec.UNSET


_ANSWER = msgspec.json.Decoder(_Answer)


def decode_chat_answer(data: bytes | bytearray | memoryview) -> Any:
    """An engine's chat answer from its bytes: the JSON value, except that each choice's
    :data:`PER_TOKEN_FIELDS` are :class:`msgspec.Raw` (their JSON text, which msgspec
    writes back as it is) when the answer has SGLang's keys and no other; an answer with
    other keys or of another shape is parsed whole (plain values). Keys keep their
    values, not their order. ``ValueError`` when it is not JSON (NaN and Infinity are
    not JSON), or nests too deeply to parse."""
    try:
        wire = _ANSWER.decode(data)
    except msgspec.ValidationError:  # JSON of another shape, or keys SGLang did not write
        return _json.loads_strict(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(str(exc) or "JSON nested too deeply to parse") from None
    answer = _present(wire, _Answer.__struct_fields__)
    answer["choices"] = [_present(c, _Choice.__struct_fields__) for c in wire.choices]
    return answer


def _present(struct: msgspec.Struct, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields ``struct`` was decoded with (absent ones left out), as a dict."""
    out = {}
    for name in names:
        value = getattr(struct, name)
        if value is not msgspec.UNSET and value is not _ABSENT:
            out[name] = value
    return out


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
    prompt_ids = _prompt_ids(
        choice.get("prompt_token_ids"), request.get("input_ids"), vocab_size, where
    )
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
    prompt_ids: Any, sent: Any, vocab_size: int | None, where: Mapping[str, str | None]
) -> list[int]:
    """The answer's ``prompt_token_ids``, checked: a non-empty list of ints (not bools,
    not floats) in ``[0, vocab_size)``. A turn's prompt is its whole history, so the check
    runs at C speed (msgspec, ~10 ns an id; Python's scans took ~50); a list that fails
    it is looked at again to say why. As JSON text (:func:`decode_chat_answer`) that is
    byte for byte the ids ``sent`` (token in: the request's ``input_ids``, as SGLang
    writes them, without spaces), they are ``sent`` itself: the engine ran them, and
    nothing is decoded."""
    if isinstance(prompt_ids, msgspec.Raw):
        if isinstance(sent, list) and sent and _same_json(prompt_ids, sent):
            return sent
        try:
            checked: list[int] = msgspec.json.decode(prompt_ids, type=_ids_type(vocab_size))
            if checked:
                return checked
        except msgspec.ValidationError:
            pass
        prompt_ids = _json.loads_strict(prompt_ids)  # read again, to say what is wrong
    elif isinstance(prompt_ids, list) and prompt_ids:
        try:
            checked = msgspec.convert(prompt_ids, _ids_type(vocab_size))
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


def _same_json(raw: msgspec.Raw, ids: list[Any]) -> bool:
    """Whether ``raw`` is ``ids`` written as SGLang writes them (compact)."""
    try:
        # bytes(), not memoryview(): a memoryview compares item by item (20x slower).
        return bytes(raw) == _json.dumps(ids, strict=False)
    except TypeError:  # not ids JSON can hold: not what was sent as JSON
        return False


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
        choice = {k: v for k, v in choice.items() if k not in PER_TOKEN_FIELDS}
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
