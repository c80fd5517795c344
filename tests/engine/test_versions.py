"""The record of weight versions: order, lag, the cache key, and which tokens were made on
KV computed by older weights (pure, no I/O)."""

from __future__ import annotations

import pytest

from miles_lite.engine.versions import WeightVersions
from miles_lite.errors import ConfigError
from miles_lite.types import WeightSpan


def versions(*updates: tuple[str, bool]) -> WeightVersions:
    log = WeightVersions()
    log.base = "default"
    for version, kept in updates:
        log.record(version, mode="retract", kept_kv=kept)
    return log


def test_versions_are_ordered_by_update_and_only_move_forward() -> None:
    log = versions(("1", False), ("2", True))
    assert log.current == "2" and log.cache_key() == "miles-lite-weights:2"
    assert [log.lag(v) for v in ("2", "1", "default")] == [0, 1, 2]
    assert log.kept_kv("2") and not log.kept_kv("1") and not log.kept_kv("default")
    log.record("2", mode="retract", kept_kv=False)  # a retry of the last update
    assert log.kept_kv("2") and len(log.records) == 2
    with pytest.raises(ConfigError, match="only move forward"):
        log.record("1", mode="retract", kept_kv=False)
    with pytest.raises(ConfigError, match="non-empty str"):
        log.record("", mode="retract", kept_kv=False)
    assert WeightVersions().cache_key() is None


def test_tokens_after_an_update_that_kept_kv_name_the_oldest_kv_in_their_context() -> None:
    log = versions(("1", True), ("2", True), ("3", False), ("4", True))
    spans = [WeightSpan("default", 0, 3), WeightSpan("1", 3, 5), WeightSpan("2", 5, 9)]
    marked = log.mark_kv(spans, sent_under=None, cached_tokens=0)
    assert [s.kv_version for s in marked] == [None, "default", "default"]
    # A flushing update in between: the request was recomputed under "3".
    spans = [WeightSpan("2", 0, 2), WeightSpan("3", 2, 4), WeightSpan("4", 4, 6)]
    marked = log.mark_kv(spans, sent_under="2", cached_tokens=0)
    assert [s.kv_version for s in marked] == [None, None, "3"]
    assert [(s.start, s.end) for s in marked] == [(0, 2), (2, 4), (4, 6)]


def test_a_request_sent_just_before_an_update_that_kept_kv_is_marked_when_its_prompt_hit() -> None:
    log = versions(("1", False), ("2", True))
    only_new = [WeightSpan("2", 0, 4)]
    # It left under "1" (its cache key) and found its prompt cached: that KV is from "1".
    assert log.mark_kv(only_new, sent_under="1", cached_tokens=5)[0].kv_version == "1"
    # No cache hit, or sent under "2" itself: clean.
    assert log.mark_kv(only_new, sent_under="1", cached_tokens=0)[0].kv_version is None
    assert log.mark_kv(only_new, sent_under="2", cached_tokens=5)[0].kv_version is None
    # Sent before the first update, with no key: the cached KV is the engines' own.
    assert (
        log.mark_kv([WeightSpan("1", 0, 1)], sent_under=None, cached_tokens=3)[0].kv_version is None
    )
    first = versions(("1", True))
    assert (
        first.mark_kv([WeightSpan("1", 0, 1)], sent_under=None, cached_tokens=3)[0].kv_version
        == "default"
    )
