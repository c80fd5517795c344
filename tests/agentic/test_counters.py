"""The session server's counters are one typed record: each refusal counts in the field
it names, and the snapshot carries every field to ``statistics()``."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from miles_lite.agentic.config import (
    RefusalCounter,
    SessionCounters,
    SessionServerStatistics,
)


def test_each_refusal_counts_in_its_own_field() -> None:
    counters = SessionCounters()
    names = typing.get_args(RefusalCounter)
    for times, name in enumerate(names, start=1):
        for _ in range(times):
            counters.count_refusal(name)
    stats = counters.snapshot(open_sessions=3)
    assert stats.open_sessions == 3
    assert [getattr(stats, name) for name in names] == list(range(1, len(names) + 1))
    untouched = {f.name for f in dataclasses.fields(SessionCounters)} - set(names)
    assert {name: getattr(stats, name) for name in untouched} == dict.fromkeys(untouched, 0)


def test_counters_are_the_statistics_fields_and_take_no_new_names() -> None:
    stats_fields = [f.name for f in dataclasses.fields(SessionServerStatistics)]
    assert stats_fields == ["open_sessions"] + [f.name for f in dataclasses.fields(SessionCounters)]
    counters = SessionCounters()
    counters.recorded += 2
    assert counters.snapshot(open_sessions=0).recorded == 2
    with pytest.raises(AttributeError):
        counters.recordd = 1  # type: ignore[attr-defined]
