"""Training samples from a session's recorded turns (TITO): pure functions, no I/O.

Two modes:

- ``per_turn``: every turn is a sample of its own (its prompt ids plus its output ids,
  loss mask 1 on the output, the engine's log-probs);
- ``merged`` (miles' default): compute each turn's sample, truncate by ``max_seq_len``
  keeping whole turns and cutting the first that overflows (TRUNCATED), then merge left to
  right. The tokens between one turn's end and the next turn's output (tool, user and
  system messages, template glue) get loss mask 0 and log-prob 0.0. Merging stops at the
  first turn that is not COMPLETED. A turn whose prompt ids do not extend the tokens so far
  (a template that is not append-only, an agent that rewrote its history) starts a new
  sample and is counted as a mismatch, instead of failing the group as miles does.

Runs in a worker thread when it decodes (``decode`` may call a tokenizer).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from miles_lite.errors import ConfigError
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.sglang.generate_wire import FINISH_STATUS
from miles_lite.types import Sample, SampleStatus, WeightSpan

__all__ = [
    "Assembly",
    "AssemblyMode",
    "assemble_samples",
    "full_prompts",
    "merge_turns",
    "status_of",
    "truncate_turns",
    "turn_samples",
]

AssemblyMode = Literal["merged", "per_turn"]
Decode = Callable[[list[int]], str]


def status_of(finish_reason: str) -> SampleStatus:
    """The sample status of a recorded turn's ``finish_reason`` (records hold only the
    ones :data:`~miles_lite.sglang.generate_wire.FINISH_STATUS` knows)."""
    return FINISH_STATUS.get(finish_reason, SampleStatus.ABORTED)


@dataclass(frozen=True, slots=True)
class Assembly:
    """The samples made from a session, and what happened on the way.

    ``mismatches``: turns whose prompt did not extend the tokens so far (each started a
    new sample); ``trimmed_tokens``: trailing tokens trimmed because the template
    re-rendered them differently; ``empty_reason``: ``"no_records"`` or
    ``"all_truncated"`` when there are no samples, else ``None``.
    """

    samples: list[Sample]
    mismatches: int = 0
    trimmed_tokens: int = 0
    empty_reason: str | None = None


def _no_decode(ids: list[int]) -> str:
    return ""


def full_prompts(records: Iterable[TurnRecord]) -> Iterator[list[int]]:
    """Each record's whole prompt, rebuilt from the session's trajectory (records keep
    only what a turn added: see :class:`~miles_lite.sglang.chat_wire.TurnRecord`)."""
    trajectory: list[int] = []
    for record in records:
        prompt = [*trajectory[: record.prefix_len], *record.prompt_ids]
        yield prompt
        trajectory = [*prompt, *record.output_ids]


def turn_samples(
    records: Sequence[TurnRecord], template: Sample, *, decode: Decode | None = None
) -> list[Sample]:
    """One sample per recorded turn, each a copy of ``template`` (index, prompt, label,
    metadata) with the turn's whole prompt and output, loss mask 1 on its output and the
    engine's log-probs. ``decode`` makes ``response`` (default: empty)."""
    decode = decode or _no_decode
    out = []
    for record, prompt in zip(records, full_prompts(records), strict=True):
        sample = _blank(template)
        sample.tokens = [*prompt, *record.output_ids]
        sample.response = decode(list(record.output_ids))
        sample.response_length = len(record.output_ids)
        sample.loss_mask = [1] * len(record.output_ids)
        sample.rollout_log_probs = list(record.output_log_probs)
        sample.weight_versions = [record.weight_version] if record.weight_version else []
        sample.weight_spans = list(record.weight_spans)
        sample.status = status_of(record.finish_reason)
        out.append(sample)
    return out


def truncate_turns(samples: Sequence[Sample], max_seq_len: int | None) -> list[Sample]:
    """Keep whole turns while their ``tokens`` fit ``max_seq_len``; cut the first that
    overflows by the overshoot (TRUNCATED), or drop it when nothing of its output would be
    left; drop every later turn. ``None`` keeps everything. Returns new samples."""
    if max_seq_len is None:
        return list(samples)
    if max_seq_len < 1:
        raise ConfigError(f"max_seq_len must be >= 1 or None, got {max_seq_len!r}")
    kept: list[Sample] = []
    for sample in samples:
        if len(sample.tokens) <= max_seq_len:
            kept.append(sample)
            continue
        overshoot = len(sample.tokens) - max_seq_len
        if sample.response_length - overshoot > 0:
            cut = copy.copy(sample)
            _strip(cut, overshoot)
            cut.status = SampleStatus.TRUNCATED
            kept.append(cut)
        break
    return kept


def merge_turns(
    samples: Sequence[Sample], *, max_trim_tokens: int = 1, decode: Decode | None = None
) -> Assembly:
    """Merge consecutive turn samples into trajectories, left to right.

    The next turn joins when its prompt ids start with the tokens so far, or with them
    less up to ``max_trim_tokens`` trailing output tokens of the previous turn (stop tokens
    the template re-renders differently; those are trimmed from the merged sample). The
    tokens in between get loss mask 0 and log-prob 0.0. Otherwise it starts a new sample
    (a mismatch). Merging stops after the first turn that is not COMPLETED; later turns
    are dropped.
    """
    return _merge((_parts_of_sample(s) for s in samples), max_trim_tokens, decode or _no_decode)


class _Turn(NamedTuple):
    """What merging reads of one turn: how it extends the tokens so far (``extends``:
    the trailing tokens to trim, None when it does not extend them; ``between``: its
    prompt's tokens after them), and its own parts."""

    extends: Callable[[list[int], int], int | None]
    between: Callable[[list[int]], list[int]]
    output: list[int]
    loss_mask: list[int]
    log_probs: list[float]
    response: Callable[[], str]
    status: SampleStatus
    weight_versions: list[str]
    weight_spans: Sequence[WeightSpan]
    start: Callable[[], Sample]  # the turn as a sample of its own (owning its lists)


def _parts_of_sample(turn: Sample) -> _Turn:
    prompt_len = len(turn.tokens) - turn.response_length
    seq = turn.tokens
    return _Turn(
        lambda so_far, max_trim: _extension_trim(so_far, seq, prompt_len, max_trim),
        lambda so_far: seq[len(so_far) : prompt_len],
        turn.tokens[prompt_len:],
        turn.loss_mask or [],
        _floats(turn.rollout_log_probs),
        lambda: turn.response,
        turn.status,
        turn.weight_versions,
        turn.weight_spans,
        lambda: _own_copy(turn),
    )


def _parts_of_record(record: TurnRecord, template: Sample, decode: Decode) -> _Turn:
    """A record read in place. The session server said how its prompt extends the
    trajectory (``prefix_len``): merging costs the turn's own tokens, no compare."""

    def extends(so_far: list[int], max_trim: int) -> int | None:
        # The server bounded the trim when it recorded the turn (max_trim_tokens of its
        # config); a record that does not extend holds its whole prompt.
        return len(so_far) - record.prefix_len if record.prefix_len else None

    return _Turn(
        extends,
        lambda so_far: record.prompt_ids,
        record.output_ids,
        [1] * len(record.output_ids),
        record.output_log_probs,
        lambda: decode(list(record.output_ids)),
        status_of(record.finish_reason),
        [record.weight_version] if record.weight_version else [],
        record.weight_spans,
        lambda: turn_samples([record], template, decode=decode)[0],
    )


def _merge(turns: Iterable[_Turn], max_trim_tokens: int, decode: Decode) -> Assembly:
    merged: list[Sample] = []
    current: Sample | None = None
    last_output = 0  # output tokens of the turn last merged into `current`
    mismatches = trimmed = 0
    for turn in turns:
        if current is None:
            current, last_output = turn.start(), len(turn.output)
            continue
        if current.status is not SampleStatus.COMPLETED:
            break
        trim = turn.extends(current.tokens, min(max_trim_tokens, last_output))
        if trim is None:
            mismatches += 1
            merged.append(current)
            current, last_output = turn.start(), len(turn.output)
            continue
        # `current` owns its lists (a turn's start()): extend them in place, so a turn
        # costs its own tokens, not the trajectory's (the prefix check runs at C speed).
        mask, log_probs = current.loss_mask, current.rollout_log_probs
        assert isinstance(mask, list) and isinstance(log_probs, list)
        if trim:
            del current.tokens[-trim:], mask[-trim:], log_probs[-trim:]
            current.response_length -= trim
            _clip_spans(current)
            trimmed += trim
        between = turn.between(current.tokens)
        offset = current.response_length + len(between)
        # Each turn's spans (kv_version marks kept) at its output's offset in the trajectory.
        current.weight_spans += [
            replace(w, start=w.start + offset, end=w.end + offset) for w in turn.weight_spans
        ]
        current.tokens += between
        current.tokens += turn.output
        current.response += decode(between) + turn.response()
        current.response_length += len(between) + len(turn.output)
        mask += [0] * len(between)
        mask += turn.loss_mask
        log_probs += [0.0] * len(between)
        log_probs += turn.log_probs
        current.weight_versions += turn.weight_versions
        current.status = turn.status
        last_output = len(turn.output)
    if current is not None:
        merged.append(current)
    return Assembly(samples=merged, mismatches=mismatches, trimmed_tokens=trimmed)


def assemble_samples(
    records: Sequence[TurnRecord],
    template: Sample,
    *,
    mode: AssemblyMode = "merged",
    max_seq_len: int | None = None,
    max_trim_tokens: int = 1,
    decode: Decode | None = None,
) -> Assembly:
    """Compute, truncate and (``merged``) merge the samples of a session's ``records``
    (all of them, in order: each holds only what its turn added).

    A turn whose prompt does not extend the trajectory (``prefix_len`` 0 after the first)
    starts a new sample and counts as a mismatch. ``max_trim_tokens`` applies where turns
    are compared (``max_seq_len`` set); records already say how they extend. Raises
    ``ConfigError`` for an unknown ``mode`` or a bad ``max_seq_len`` / ``max_trim_tokens``.
    """
    if mode not in ("merged", "per_turn"):
        raise ConfigError(f"mode must be 'merged' or 'per_turn', got {mode!r}")
    if not isinstance(max_trim_tokens, int) or max_trim_tokens < 0:
        raise ConfigError(f"max_trim_tokens must be an int >= 0, got {max_trim_tokens!r}")
    if not records:
        return Assembly(samples=[], empty_reason="no_records")
    if mode == "merged" and max_seq_len is None:
        # The common case, read from the records in place (no per-turn sample).
        parts = (_parts_of_record(r, template, decode or _no_decode) for r in records)
        result = _merge(parts, max_trim_tokens, decode or _no_decode)
    else:
        turns = truncate_turns(turn_samples(records, template, decode=decode), max_seq_len)
        if not turns:
            return Assembly(samples=[], empty_reason="all_truncated")
        if mode == "per_turn":
            result = Assembly(samples=turns)
        else:
            result = merge_turns(turns, max_trim_tokens=max_trim_tokens, decode=decode)
    return result


def _extension_trim(
    so_far: list[int], tokens: list[int], prompt_len: int, max_trim: int
) -> int | None:
    """The fewest trailing tokens of ``so_far`` (at most ``max_trim``) to drop so that the
    prompt (``tokens[:prompt_len]``) starts with it; ``None`` when no such trim exists.

    One slice and one compare at C speed when nothing is trimmed (the usual case): the
    prompt is the whole history, so this is what a turn costs as sessions grow."""
    if len(so_far) <= prompt_len and tokens[: len(so_far)] == so_far:
        return 0
    for trim in range(1, max_trim + 1):
        head = len(so_far) - trim
        if head <= prompt_len and tokens[:head] == so_far[:head]:
            return trim
    return None


def _clip_spans(sample: Sample) -> None:
    """Cut the weight spans of ``sample`` at the end of its response."""
    n = sample.response_length
    sample.weight_spans = [
        replace(w, end=min(w.end, n)) for w in sample.weight_spans if w.start < n
    ]


def _strip(sample: Sample, n: int) -> None:
    """Drop the last ``n`` response tokens of ``sample`` (new lists, not in place)."""
    sample.tokens = sample.tokens[: len(sample.tokens) - n]
    sample.response_length -= n
    _clip_spans(sample)
    if sample.loss_mask is not None:
        sample.loss_mask = sample.loss_mask[: len(sample.loss_mask) - n]
    if isinstance(sample.rollout_log_probs, list):
        sample.rollout_log_probs = sample.rollout_log_probs[: len(sample.rollout_log_probs) - n]


def _floats(values: object) -> list[float]:
    return list(values) if isinstance(values, list) else []


def _own_copy(sample: Sample) -> Sample:
    out = copy.copy(sample)
    out.tokens = list(sample.tokens)
    out.loss_mask = list(sample.loss_mask or [])
    out.rollout_log_probs = list(sample.rollout_log_probs or [])
    out.weight_versions = list(sample.weight_versions)
    out.weight_spans = list(sample.weight_spans)
    out.metadata = dict(sample.metadata)
    return out


def _blank(template: Sample) -> Sample:
    return Sample(
        index=template.index,
        group_index=template.group_index,
        prompt=template.prompt,
        label=template.label,
        metadata=dict(template.metadata),
    )
