"""Metrics of a text rollout, computed from its kept samples, with miles' names."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from operator import attrgetter

from miles_lite.rollout.filters import reward_value
from miles_lite.types import Sample, SampleStatus

__all__ = ["text_metrics"]

_STATUS = attrgetter("status")


def text_metrics(
    samples: list[Sample], *, rollout_time_s: float | None = None, reward_key: str | None = None
) -> dict[str, float]:
    """``rollout/response_len/*``, ``rollout/truncated_ratio``, ``rollout/zero_std/*``,
    weight versions, TITO mismatches and, given the rollout time, ``perf/tokens_per_sec``.

    Response lengths are :attr:`~miles_lite.types.Sample.effective_response_length`
    (model tokens, not tool output), as miles logs them; ``perf/tokens_per_sec`` counts
    every response token. FAILED samples are left out of length statistics.
    """
    metrics: dict[str, float] = {}
    live = [s for s in samples if s.status is not SampleStatus.FAILED]
    lengths = [s.effective_response_length for s in live]
    if lengths:
        metrics["rollout/response_len/mean"] = statistics.fmean(lengths)
        metrics["rollout/response_len/median"] = float(statistics.median(lengths))
        metrics["rollout/response_len/max"] = float(max(lengths))
        metrics["rollout/response_len/min"] = float(min(lengths))
    if samples:
        statuses = Counter(map(_STATUS, samples))
        metrics["rollout/truncated_ratio"] = statuses[SampleStatus.TRUNCATED] / len(samples)
        metrics["rollout/aborted_ratio"] = statuses[SampleStatus.ABORTED] / len(samples)
    if rollout_time_s and rollout_time_s > 0:
        total = sum(s.response_length for s in live)
        metrics["perf/tokens_per_sec"] = total / rollout_time_s
        metrics["perf/effective_tokens_per_sec"] = sum(lengths) / rollout_time_s
        if live:
            metrics["perf/longest_sample_tokens_per_sec"] = (
                max(s.response_length for s in live) / rollout_time_s
            )
    metrics.update(_zero_std(samples, reward_key))
    metrics.update(_weight_versions(live))
    sessions = [s.session for s in samples if s.session is not None]
    if sessions:
        metrics["rollout/tito_session_mismatch_rate"] = sum(
            bool(session.tito_mismatches) for session in sessions
        ) / len(sessions)
    return metrics


def _zero_std(samples: list[Sample], reward_key: str | None) -> dict[str, float]:
    """Groups whose rewards all agree, counted by that reward rounded to 0.1
    (``rollout/zero_std/count_1.0``, as :func:`~miles_lite.rollout.filters.drop_zero_std`
    spells its reason ``drop_zero_std_1.0``; DAPO's zero-std groups)."""
    groups: dict[int, list[float | None]] = defaultdict(list)
    for sample in samples:
        groups[sample.group_index].append(reward_value(sample, reward_key))
    counts: dict[str, float] = {}
    all_zero = all_one = scored = 0
    for values in groups.values():
        if len(values) < 2 or any(v is None for v in values):
            continue
        scored += 1
        first = values[0]
        if first is not None and all(v == first for v in values):
            # miles' spelling, and the value's in drop_zero_std's reason: count_1.0.
            key = f"rollout/zero_std/count_{round(first, 1)}"
            counts[key] = counts.get(key, 0.0) + 1.0
            all_zero += first == 0.0
            all_one += first == 1.0
    if scored:
        counts["rollout/zero_std/all_zero_percentage"] = all_zero / scored
        counts["rollout/zero_std/all_one_percentage"] = all_one / scored
    return counts


def _weight_versions(samples: list[Sample]) -> dict[str, float]:
    """Spread of the policy versions the samples were generated with."""
    seen = [s.weight_versions for s in samples if s.weight_versions]
    if not seen:
        return {}
    distinct = {v for vs in seen for v in vs}
    metrics = {
        "rollout/weight_version/distinct": float(len(distinct)),
        "rollout/weight_version/mixed_version_ratio": sum(len(set(vs)) > 1 for vs in seen)
        / len(seen),
    }
    # Over the distinct versions: a version that is not a number is tried once, not once
    # per sample.
    numeric = [float(v) for v in distinct if _is_number(v)]
    if numeric:
        metrics["rollout/weight_version/min"] = min(numeric)
        metrics["rollout/weight_version/max"] = max(numeric)
    return metrics


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
