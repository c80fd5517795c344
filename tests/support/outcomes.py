"""What a rollout disturbed by its fleet (killed, stopped, added or removed engines) must
still give: every sample once (:func:`check_exactly_once`), for the fleet and chaos tiers."""

from __future__ import annotations

from miles_lite import SampleStatus
from miles_lite.errors import MilesLiteError
from miles_lite.rollout.result import RolloutResult

__all__ = ["check_exactly_once", "check_none_failed", "failures"]


def check_exactly_once(result: RolloutResult, groups: int, per_group: int) -> dict[str, int]:
    """Every sample given came back exactly once (kept, filtered or partial, by group and
    index); their statuses counted. A FAILED sample carries its typed error."""
    flat = [s for part in (result.groups, result.filtered, result.partial) for g in part for s in g]
    keys = [(s.group_index, s.index) for s in flat]
    assert len(keys) == len(set(keys)) == groups * per_group
    counts: dict[str, int] = {}
    for sample in flat:
        counts[sample.status.value] = counts.get(sample.status.value, 0) + 1
        if sample.status is SampleStatus.FAILED:
            assert isinstance(sample.error, MilesLiteError), sample.error
    return counts


def failures(result: RolloutResult) -> list[BaseException]:
    """The typed errors of the FAILED samples (kept, filtered or partial)."""
    return [
        s.error
        for part in (result.groups, result.filtered, result.partial)
        for g in part
        for s in g
        if s.status is SampleStatus.FAILED and s.error is not None
    ]


def check_none_failed(result: RolloutResult, groups: int, per_group: int) -> dict[str, int]:
    """:func:`check_exactly_once`, and no sample FAILED (the failures' errors, when some did,
    are the assertion's message: a chaos tier run in CI shows what went wrong)."""
    counts = check_exactly_once(result, groups, per_group)
    assert "failed" not in counts, [repr(e) for e in failures(result)]
    return counts
