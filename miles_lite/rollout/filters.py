"""Dynamic sampling filters: keep or drop a finished group, with a reason.

A filter is ``(group) -> bool | FilterResult``. A dropped group's reason has one spelling
everywhere: ``drop_<the filter's reason>`` (``drop_zero_std_1.0``) in
``result.filter_reasons``, in the metric ``rollout/dynamic_filter/<reason>`` (miles'
``rollout/dynamic_filter/drop_<reason>``) and in ``result.summary()``; a drop without a
reason is ``drop_filtered``. Built in, as miles' filter hub: :func:`drop_zero_std` (DAPO:
the group's rewards all agree, so it teaches nothing), :func:`drop_aborted` (a sample of
the group was aborted) and :func:`drop_failed`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miles_lite.errors import FilterError
from miles_lite.types import Sample, SampleStatus

__all__ = [
    "FilterResult",
    "GroupFilter",
    "apply_filters",
    "drop_aborted",
    "drop_failed",
    "drop_reason",
    "drop_zero_std",
    "reward_value",
]


@dataclass(frozen=True, slots=True)
class FilterResult:
    """A filter's verdict: ``keep``, and why not (``reason``: :func:`apply_filters` spells
    it ``drop_<reason>``, the last part of the metric's name)."""

    keep: bool
    reason: str | None = None


#: ``filter(group) -> keep?``, called once per finished group after its rewards.
GroupFilter = Callable[[list[Sample]], "bool | FilterResult"]


def reward_value(sample: Sample, reward_key: str | None = None) -> float | None:
    """The sample's reward as a float: ``reward[reward_key]`` for dict rewards."""
    reward: Any = sample.reward
    if isinstance(reward, dict):
        if reward_key is None:
            return None
        reward = reward.get(reward_key)
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return None
    return float(reward)


def drop_zero_std(reward_key: str | None = None, *, eps: float = 1e-8) -> GroupFilter:
    """A filter dropping groups whose rewards all agree (std <= ``eps``), reason
    ``drop_zero_std_<reward rounded to 0.1>`` (``drop_zero_std_1.0``: the value spelt as
    in ``rollout/zero_std/count_1.0``). Groups with a missing reward are kept."""

    def check(group: list[Sample]) -> FilterResult:
        values = [reward_value(s, reward_key) for s in group]
        if not values or any(v is None for v in values):
            return FilterResult(True)
        floats = [v for v in values if v is not None]
        mean = math.fsum(floats) / len(floats)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in floats) / len(floats))
        if std > eps:
            return FilterResult(True)
        return FilterResult(False, f"drop_zero_std_{round(floats[0], 1)}")

    return check


def drop_aborted(group: list[Sample]) -> FilterResult:
    """Drop a group holding an ABORTED sample (reason ``drop_aborted``)."""
    if any(s.status is SampleStatus.ABORTED for s in group):
        return FilterResult(False, "drop_aborted")
    return FilterResult(True)


def drop_failed(group: list[Sample]) -> FilterResult:
    """Drop a group holding a FAILED sample (reason ``drop_failed``)."""
    if any(s.status is SampleStatus.FAILED for s in group):
        return FilterResult(False, "drop_failed")
    return FilterResult(True)


def drop_reason(reason: str | None) -> str:
    """A filter's reason as results and metrics spell it: ``drop_<reason>``
    (``"odd" -> "drop_odd"``, ``"drop_odd" -> "drop_odd"``, ``None -> "drop_filtered"``)."""
    if not reason:
        return "drop_filtered"
    return reason if reason.startswith("drop_") else f"drop_{reason}"


def apply_filters(filters: Sequence[GroupFilter], group: list[Sample]) -> FilterResult:
    """The first drop among ``filters``, else keep.

    The reason of a drop is ``drop_<the filter's reason>`` (a reason already starting
    with ``drop_`` is kept as it is; none: ``drop_filtered``), so that it reads as the
    metric ``rollout/dynamic_filter/<reason>`` does.
    A filter that raises drops the group with reason ``drop_filter_error`` and fails its samples
    with a :class:`~miles_lite.errors.FilterError` whose cause is the filter's exception;
    a filter returning something else than a bool or a FilterResult is treated the same.
    """
    for check in filters:
        name = getattr(check, "__qualname__", repr(check))
        try:
            verdict = check(group)
            if isinstance(verdict, bool):
                verdict = FilterResult(verdict)
            if not isinstance(verdict, FilterResult):
                raise TypeError(f"returned {verdict!r}, not a bool or a FilterResult")
        except Exception as exc:
            error = FilterError(f"dynamic filter {name} raised {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            for sample in group:
                sample.fail(error)
            return FilterResult(False, "drop_filter_error")
        if not verdict.keep:
            return FilterResult(False, drop_reason(verdict.reason))
    return FilterResult(True)
