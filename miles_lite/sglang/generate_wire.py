"""SGLang's ``/generate``: the request a text sample sends and what its answer means.

Pure, no I/O. One parser of answers (:func:`parse_generate_answer`) and of the
``[logprob, id, text]`` triples every SGLang answer carries (:func:`parse_logprob_triples`,
shared with chat records): values from the network are checked, never coerced. An answer
that breaks the format fails its sample with an :class:`EngineProtocolError` naming the
engine, the rid, the field and the position; nothing of it reaches the sample.

:func:`decode_generate_answer` reads an answer straight from its bytes: a typed decode at
C speed into objects the garbage collector never tracks (an answer parsed into dicts is
some forty containers per request, and their collection cost more than the parse). It
takes only an answer that is well formed in every respect the parser checks; anything
else goes to :func:`parse_generate_answer`, which names what is wrong, so both give the
same answer and the same errors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from miles_lite._core import json as _json
from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.sampling import check_sampling_keys
from miles_lite.types import SampleStatus, WeightSpan

__all__ = [
    "FINISH_STATUS",
    "GENERATE_PATH",
    "GenerateAnswer",
    "build_generate_payload",
    "decode_generate_answer",
    "new_rid",
    "parse_generate_answer",
    "parse_logprob_triples",
    "parse_output_tokens",
    "parse_weight_spans",
]

GENERATE_PATH = "/generate"

#: What each ``finish_reason`` means for a sample (SGLang's ``/generate`` types, and the
#: OpenAI strings of its chat endpoint).
FINISH_STATUS: dict[str, SampleStatus] = {
    "stop": SampleStatus.COMPLETED,
    "tool_calls": SampleStatus.COMPLETED,
    "length": SampleStatus.TRUNCATED,
    "abort": SampleStatus.ABORTED,
}


def new_rid() -> str:
    """A fresh request id: 32 hex digits, so that no rid is a prefix of another (SGLang
    aborts by rid prefix)."""
    return os.urandom(16).hex()


def build_generate_payload(
    input_ids: Sequence[int],
    sampling_params: dict[str, Any],
    *,
    seed: int | None = None,
    rid: str | None = None,
    image_data: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``/generate`` body: ids in, ids and log-probs out, a fresh fixed-length rid.

    ``sampling_params`` is used as given (the caller's own dict); its keys are checked
    against SGLang's (``SamplingParamsError`` naming a wrong one: nothing is sent).
    ``return_logprob`` without ``logprob_start_len`` (its default, -1, asks for output
    log-probs only and keeps the prefix cache useful); ``sampling_seed`` from ``seed``
    unless set; ``image_data`` (data URLs) for multimodal prompts.
    """
    check_sampling_keys(sampling_params)
    if seed is not None and "sampling_seed" not in sampling_params:
        sampling_params["sampling_seed"] = seed
    payload: dict[str, Any] = {
        "input_ids": input_ids if type(input_ids) is list else list(input_ids),
        "sampling_params": sampling_params,
        "rid": rid or new_rid(),
        "return_logprob": True,
    }
    if image_data:
        payload["image_data"] = list(image_data)
    return payload


@dataclass(frozen=True, slots=True)
class GenerateAnswer:
    """A ``/generate`` answer, checked: the output ``ids`` and their ``log_probs`` (finite,
    <= 0), the ``status`` its finish reason means, the reason itself (``finish_reason``)
    and the stop it matched, the ``text``, the weight version spans over the output, the
    prompt tokens the engine counted and found cached."""

    rid: str
    url: str | None
    text: str
    ids: list[int]
    log_probs: list[float]
    status: SampleStatus
    finish_reason: str
    matched_stop: int | str | None
    weight_spans: tuple[WeightSpan, ...]
    prompt_tokens: int
    cached_tokens: int


def parse_generate_answer(
    answer: Any,
    *,
    rid: str,
    url: str | None = None,
    vocab_size: int | None = None,
    in_flight: bool = False,
) -> GenerateAnswer:
    """Check one ``/generate`` answer to request ``rid`` and read it.

    Refused, with an :class:`EngineProtocolError` naming the field (and position): not an
    object with ``meta_info``; an echoed rid that is not ``rid``; triples that are not
    ``[logprob, id, ...]`` with an int id (in ``[0, vocab_size)`` when given) and a finite
    float log-prob <= 0; ``output_ids`` that differ; a ``completion_tokens`` other than
    the count; an unknown finish reason; counts that are not ints >= 0; weight version
    spans that do not cover the output.

    ``in_flight``: a streamed chunk before the last (``finish_reason`` null, checked so):
    the tokens so far, as an ABORTED answer (finish reason ``"abort"``).
    """
    where = {"url": url, "request_id": rid}
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise EngineProtocolError(
            f"/generate answered {type(answer).__name__}, not one object with meta_info", **where
        )
    meta = answer["meta_info"]
    ids, log_probs = parse_output_tokens(meta, rid, where, vocab_size=vocab_size)
    output_ids = answer.get("output_ids")
    if output_ids is not None and output_ids != ids:
        raise EngineProtocolError(
            f"output_ids {output_ids[:8]!r}... differ from the ids of output_token_logprobs"
            f" {ids[:8]!r}...",
            **where,
        )
    completion = meta.get("completion_tokens")
    if completion is not None and completion != len(ids):
        raise EngineProtocolError(
            f"meta_info.completion_tokens is {completion!r} for {len(ids)} output tokens", **where
        )
    finish = meta.get("finish_reason")
    if in_flight:  # a chunk before the last: no finish reason yet
        finish = {"type": "abort"} if finish is None else None
    kind = finish.get("type") if isinstance(finish, dict) else None
    status = FINISH_STATUS.get(kind) if isinstance(kind, str) and kind != "tool_calls" else None
    if status is None:
        raise EngineProtocolError(f"unexpected meta_info.finish_reason {finish!r}", **where)
    matched = finish.get("matched")
    if matched is not None and type(matched) not in (int, str):
        raise EngineProtocolError(f"finish_reason.matched is {matched!r}", **where)
    text = answer.get("text", "")
    if not isinstance(text, str):
        raise EngineProtocolError(f"text is {type(text).__name__}, not a string", **where)
    return GenerateAnswer(
        rid=rid,
        url=url,
        text=text,
        ids=ids,
        log_probs=log_probs,
        status=status,
        finish_reason=kind,  # type: ignore[arg-type]
        matched_stop=matched,
        weight_spans=parse_weight_spans(meta, len(ids), where),
        prompt_tokens=_count(meta, "prompt_tokens", where),
        cached_tokens=_count(meta, "cached_tokens", where),
    )


def parse_output_tokens(
    meta: Mapping[str, Any],
    rid: str,
    where: Mapping[str, str | None],
    *,
    vocab_size: int | None = None,
) -> tuple[list[int], list[float]]:
    """The output ids and log-probs of an answer's ``meta_info``, once it is this
    request's: a ``meta_info.id`` other than ``rid`` is an :class:`EngineProtocolError`
    (one rule for ``/generate`` and chat answers); the triples as
    :func:`parse_logprob_triples` checks them."""
    echoed = meta.get("id")
    if echoed is not None and echoed != rid:
        raise EngineProtocolError(
            f"meta_info.id is {echoed!r}, not the request's rid: not this request's answer",
            **where,
        )
    return parse_logprob_triples(meta.get("output_token_logprobs"), where, vocab_size=vocab_size)


def parse_logprob_triples(
    triples: Any, where: Mapping[str, str | None], *, vocab_size: int | None = None
) -> tuple[list[int], list[float]]:
    """The ids and log-probs of ``output_token_logprobs`` (``[logprob, id, text]``
    triples), checked at C speed; the first bad triple is named in an
    :class:`EngineProtocolError`: a triple that is not a list, an id that is not an int
    (in ``[0, vocab_size)``), a log-prob that is not a finite float <= 0 (``None`` is not
    0.0: it is no log-prob)."""
    if not isinstance(triples, list):
        raise EngineProtocolError(
            f"meta_info.output_token_logprobs is {type(triples).__name__}, not a list of"
            " [logprob, id, text] (the request must ask for return_logprob)",
            **where,
        )
    fast = _fast_triples(triples, vocab_size)
    if fast is not None:
        return fast
    for i, triple in enumerate(triples):
        problem = _triple_problem(triple, vocab_size)
        if problem:
            raise EngineProtocolError(
                f"meta_info.output_token_logprobs[{i}] is {triple!r:.80}: {problem}", **where
            )
    # Every triple is fine (their sum only overflowed): read them one by one.
    return [t[1] for t in triples], [float(t[0]) for t in triples]


def _fast_triples(
    triples: list[Any], vocab_size: int | None
) -> tuple[list[int], list[float]] | None:
    """The ids and log-probs when every triple is well formed (checked at C speed: a
    turn's answer holds thousands), else None."""
    try:
        ids = [t[1] for t in triples]
        values = [t[0] for t in triples]
    except (TypeError, IndexError, KeyError):
        return None
    if not triples:
        return [], []
    value_types = set(map(type, values))
    if not (
        set(map(type, triples)) <= {list, tuple}
        and set(map(type, ids)) <= {int}
        and value_types <= {float, int}
        and min(ids) >= 0
        and (vocab_size is None or max(ids) < vocab_size)
        and max(values) <= 0.0
        and math.isfinite(sum(values))
    ):
        return None
    return ids, (list(map(float, values)) if int in value_types else values)


def _triple_problem(triple: Any, vocab_size: int | None) -> str | None:
    if not isinstance(triple, list | tuple) or len(triple) < 2:
        return "not [logprob, id, text]"
    value, token = triple[0], triple[1]
    if type(token) is not int:
        return f"the id is {type(token).__name__}, not an int"
    if token < 0 or (vocab_size is not None and token >= vocab_size):
        return f"the id {token} is outside the vocabulary [0, {vocab_size})"
    if type(value) not in (float, int):
        return f"the log-prob is {value!r}, not a number"
    if not math.isfinite(value):
        return f"the log-prob {value!r} is not finite"
    if value > 0:
        return f"the log-prob {value!r} is positive (a probability above 1)"
    return None


def parse_weight_spans(
    meta: Mapping[str, Any], n_output: int, where: Mapping[str, str | None]
) -> tuple[WeightSpan, ...]:
    """The weight versions over the output tokens: ``meta_info.weight_versions`` spans
    (``{version, start, end}``, covering ``[0, n_output)`` in order), or one span of
    ``weight_version``; ``()`` when the answer names no version."""
    spans = meta.get("weight_versions")
    if spans is None:
        version = meta.get("weight_version")
        if version is None:
            return ()
        if not isinstance(version, str):
            raise EngineProtocolError(f"meta_info.weight_version is {version!r}", **where)
        return (WeightSpan(version, 0, n_output),)
    if isinstance(spans, list) and all(isinstance(span, dict) for span in spans):
        covering = _covering(
            [(span.get("version"), span.get("start"), span.get("end")) for span in spans],
            n_output,
        )
        if covering is not None:
            return covering
    raise EngineProtocolError(
        f"meta_info.weight_versions {spans!r:.200} do not cover the {n_output} output tokens"
        " in order",
        **where,
    )


def _covering(spans: list[tuple[Any, Any, Any]], n_output: int) -> tuple[WeightSpan, ...] | None:
    """``(version, start, end)`` spans as WeightSpans when they cover ``[0, n_output)`` in
    order (string versions, int bounds), else None."""
    out: list[WeightSpan] = []
    at = 0
    for version, start, end in spans:
        if not (
            isinstance(version, str)
            and type(start) is int
            and type(end) is int
            and start == at
            and end >= start
        ):
            return None
        out.append(WeightSpan(version, start, end))
        at = end
    return tuple(out) if at == n_output else None


def _count(meta: Mapping[str, Any], key: str, where: Mapping[str, str | None]) -> int:
    value = meta.get(key, 0)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise EngineProtocolError(f"meta_info.{key} is {value!r}, not an int >= 0", **where)
    return value


# -- the typed fast path -----------------------------------------------------------------
# gc=False: these objects hold only numbers and strings decoded from JSON (no cycles), so
# the garbage collector need never scan them.


class _Triple(msgspec.Struct, array_like=True, gc=False):
    # Bounds checked as the bytes are decoded, not in passes over the lists after (the
    # vocabulary's bound, which varies, is one pass in _typed_answer).
    logprob: Annotated[float, msgspec.Meta(le=0.0)]
    id: Annotated[int, msgspec.Meta(ge=0)]
    text: str | None = None


class _Finish(msgspec.Struct, gc=False):
    type: str
    matched: int | str | None = None


class _Span(msgspec.Struct, gc=False):
    version: str
    start: int
    end: int


class _Meta(msgspec.Struct, gc=False):
    output_token_logprobs: list[_Triple]
    id: str | None = None
    finish_reason: _Finish | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = 0
    cached_tokens: int | None = 0
    weight_version: str | None = None
    weight_versions: list[_Span] | None = None


class _Answer(msgspec.Struct, gc=False):
    meta_info: _Meta
    text: str = ""
    output_ids: list[int] | None = None


_DECODER = msgspec.json.Decoder(_Answer)


def decode_generate_answer(
    body: bytes | bytearray | memoryview,
    *,
    rid: str,
    url: str | None = None,
    vocab_size: int | None = None,
) -> GenerateAnswer:
    """Read and check one ``/generate`` answer from its body's bytes: what
    :func:`parse_generate_answer` gives for the parsed JSON, with the same errors (and an
    :class:`EngineProtocolError` when the body is not JSON), without making a dict or list
    per field and triple on the usual path (see the module doc)."""
    try:
        wire = _DECODER.decode(body)
    except msgspec.MsgspecError:  # a value out of its bounds too: the parser names it
        wire = None
    answer = None if wire is None else _typed_answer(wire, rid, url, vocab_size)
    if answer is not None:
        return answer
    # Not the usual shape, or a value the checks refuse: the general parser names it.
    try:
        parsed = _json.loads(body)
    except ValueError as exc:
        raise EngineProtocolError(
            f"answer to POST {GENERATE_PATH} is not JSON: {exc}", url=url, request_id=rid
        ) from exc
    return parse_generate_answer(parsed, rid=rid, url=url, vocab_size=vocab_size)


def _typed_answer(
    wire: _Answer, rid: str, url: str | None, vocab_size: int | None
) -> GenerateAnswer | None:
    """The answer when every check :func:`parse_generate_answer` makes passes, else None
    (never an error: the general parser names it)."""
    meta = wire.meta_info
    if meta.id is not None and meta.id != rid:
        return None
    triples = meta.output_token_logprobs
    # Comprehensions, not map(attrgetter(...)): about 30% faster over these structs.
    ids = [t.id for t in triples]
    log_probs = [t.logprob for t in triples]
    # Each value is finite (msgspec refuses NaN, Infinity and overflowing numbers); a sum
    # that overflows goes to the parser too, which then reads the values one by one. Ids
    # are >= 0 and log-probs <= 0 (the decode checked them).
    if ids and not (
        (vocab_size is None or max(ids) < vocab_size) and math.isfinite(sum(log_probs))
    ):
        return None
    n = len(ids)
    if (wire.output_ids is not None and wire.output_ids != ids) or (
        meta.completion_tokens is not None and meta.completion_tokens != n
    ):
        return None
    finish = meta.finish_reason
    status = (
        None if finish is None or finish.type == "tool_calls" else FINISH_STATUS.get(finish.type)
    )
    prompt_tokens = meta.prompt_tokens or 0
    cached_tokens = meta.cached_tokens or 0
    if finish is None or status is None or prompt_tokens < 0 or cached_tokens < 0:
        return None
    if meta.weight_versions is not None:
        spans = _covering([(s.version, s.start, s.end) for s in meta.weight_versions], n)
        if spans is None:
            return None
    elif meta.weight_version is not None:
        spans = (WeightSpan(meta.weight_version, 0, n),)
    else:
        spans = ()
    return GenerateAnswer(
        rid=rid,
        url=url,
        text=wire.text,
        ids=ids,
        log_probs=log_probs,
        status=status,
        finish_reason=finish.type,
        matched_stop=finish.matched,
        weight_spans=spans,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
    )
