"""max_staleness: a group lagging more weight updates than that is never handed to the
trainer; it is dropped, or its stale samples are reset and it is generated again under
the current version; the lags and tokens per version are reported."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from miles_lite import SampleStatus
from miles_lite.engine.versions import WeightVersions
from miles_lite.errors import RolloutWarning
from miles_lite.rollout.config import StalenessPolicy
from miles_lite.training.staleness import (
    group_lag,
    reset_stale_samples,
    sample_lag,
    staleness_metrics,
)
from miles_lite.types import PrefixCacheInfo, Sample, WeightSpan
from tests.support.polling import wait_until

from .conftest import OpenScripted

pytestmark = pytest.mark.anyio


def made(index: int, *spans: tuple[str, int]) -> Sample:
    out, at = [], 0
    for version, n in spans:
        out.append(WeightSpan(version, at, at + n))
        at += n
    return Sample(
        index=index,
        tokens=[7, 8, *range(100, 100 + at)],
        response="x" * at,
        response_length=at,
        loss_mask=[1] * at,
        rollout_log_probs=[-1.0] * at,
        weight_versions=[s[0] for s in spans],
        weight_spans=out,
        status=SampleStatus.COMPLETED,
        reward=1.0,
        prefix_cache_info=PrefixCacheInfo(cached_tokens=1, total_prompt_tokens=2),
    )


def test_lags_count_updates_behind_the_current_version_from_the_oldest_token() -> None:
    versions = WeightVersions()
    versions.base = "default"
    for v in ("1", "2", "3"):
        versions.record(v, mode="retract", kept_kv=False)
    fresh, mixed, old = made(0, ("3", 4)), made(1, ("1", 2), ("3", 2)), made(2, ("default", 3))
    assert [sample_lag(s, versions) for s in (fresh, mixed, old)] == [0, 2, 3]
    assert sample_lag(Sample(), versions) is None and group_lag([Sample()], versions) is None
    assert group_lag([fresh, mixed], versions) == 2
    metrics = staleness_metrics([[fresh], [fresh, mixed], [old]], versions)
    assert (metrics["rollout/staleness_mean"], metrics["rollout/staleness_max"]) == (5 / 3, 3.0)
    assert metrics["rollout/staleness_min"] == 0.0
    assert metrics["rollout/tokens_per_version/3"] == 10.0
    assert metrics["rollout/tokens_per_version/default"] == 3.0
    group = [fresh, mixed, old]
    assert reset_stale_samples(group, versions, 2) == 1  # only the one 3 behind
    assert old.status is SampleStatus.PENDING and old.tokens == [7, 8]
    assert (old.response, old.response_length, old.weight_spans, old.reward) == ("", 0, [], None)
    assert old.loss_mask is None and old.rollout_log_probs is None
    assert old.prefix_cache_info.cached_tokens == 0
    assert mixed.status is SampleStatus.COMPLETED and mixed.response_length == 4


@pytest.mark.parametrize("policy", [StalenessPolicy.DROP, StalenessPolicy.RESUME])
async def test_groups_that_went_stale_in_the_buffer_are_dropped_or_made_again(
    scripted_rollout: OpenScripted, policy: StalenessPolicy
) -> None:
    async with scripted_rollout(
        n_samples_per_prompt=2, max_staleness=0, staleness_policy=policy
    ) as (rollout, engine):
        got: list[list[Sample]] = []
        async with rollout.stream(["a", "b", "c"], max_ahead=3) as groups:
            # All three made by the engines' own weights, waiting for the trainer.
            await wait_until(lambda: groups.statistics().max_buffered == 3)
            async for group in groups:
                got.append(group)
                if len(got) == 1:
                    # The trainer steps on the first group: the two others are 1 behind.
                    await rollout.update_weights(None, version="1")
        result = groups.result
        stats = groups.statistics()
        sent = len(engine.statistics().requests)
    assert {s.version for s in got[0][0].weight_spans} == {"default"}
    metrics = result.metrics
    if policy is StalenessPolicy.DROP:
        assert len(got) == 1 and stats.dropped_stale == 2 and sent == 6
        assert result.filter_reasons == ["stale", "stale"]
        assert metrics["rollout/staleness_dropped_groups"] == 2.0
    else:
        assert len(got) == 3 and stats.resumed_stale == 2 and stats.resumed_samples == 4
        assert sent == 10  # 4 samples made again
        assert all({s.version for x in g for s in x.weight_spans} == {"1"} for g in got[1:])
        assert metrics["rollout/staleness_resumed_groups"] == 2.0
        assert metrics["rollout/tokens_per_version/1"] > 0
    assert metrics["rollout/staleness_max"] == 0.0  # nothing stale reached the trainer


@pytest.mark.parametrize("policy", [StalenessPolicy.DROP, StalenessPolicy.RESUME])
async def test_run_refuses_groups_the_weights_moved_past_during_it(
    scripted_rollout: OpenScripted, policy: StalenessPolicy
) -> None:
    async with scripted_rollout(
        answer_tokens=30,
        token_latency_s=0.01,
        n_samples_per_prompt=2,
        max_staleness=0,
        staleness_policy=policy,
    ) as (rollout, engine):
        async with anyio.create_task_group() as tg:
            out: dict[str, Any] = {}

            async def run() -> None:
                # Its one group goes stale: the run says it kept none of the one asked for.
                with pytest.warns(RolloutWarning, match="kept 0 of 1 group"):
                    out["result"] = await rollout.run(["a"])

            tg.start_soon(run)
            await wait_until(lambda: engine.stats.generated_tokens >= 4)
            await rollout.update_weights(None, version="1")
        result = out["result"]
        assert result.groups == []
        if policy is StalenessPolicy.DROP:
            assert result.filter_reasons == ["stale"]
            assert result.metrics["rollout/staleness_dropped_groups"] == 1.0
            return
        (group,) = result.partial
        assert all(s.status is SampleStatus.PENDING and s.response_length == 0 for s in group)
        again = await rollout.run(result.partial)
    assert {s.version for x in again.samples for s in x.weight_spans} == {"1"}
    assert len(again.groups) == 1


@pytest.mark.parametrize("policy", [StalenessPolicy.DROP, StalenessPolicy.RESUME])
def test_one_gate_decides_for_run_and_stream(policy: StalenessPolicy) -> None:
    # Rollout.run() and GroupStream both hand each kept group to a StalenessGate: the
    # same groups pass, are dropped or are reset, counted under the same metric keys.
    from miles_lite.training.staleness import StalenessGate

    versions = WeightVersions()
    versions.base = "default"
    for v in ("1", "2"):
        versions.record(v, mode="retract", kept_kv=False)
    groups = [
        [made(0, ("2", 3)), made(1, ("2", 2))],  # lag 0
        [made(2, ("1", 2), ("2", 2))],  # lag 1
        [made(3, ("default", 3)), made(4, ("2", 1))],  # lag 2: stale past 1
    ]
    gate = StalenessGate(versions, 1, policy)
    verdicts = [gate.check(g) for g in groups]
    stale = "dropped" if policy is StalenessPolicy.DROP else "resumed"
    assert verdicts == ["fresh", "fresh", stale]
    metrics = gate.metrics(groups[:2])
    assert gate.lags == [0, 1]
    assert metrics["rollout/staleness_max"] == 1.0
    if policy is StalenessPolicy.DROP:
        assert metrics["rollout/staleness_dropped_groups"] == 1.0
        assert groups[2][0].status is SampleStatus.COMPLETED  # a dropped group is untouched
    else:
        assert metrics["rollout/staleness_resumed_groups"] == 1.0
        assert metrics["rollout/staleness_resumed_samples"] == 1.0  # only the stale sample
        assert groups[2][0].status is SampleStatus.PENDING
        assert groups[2][1].status is SampleStatus.COMPLETED
    unbounded = StalenessGate(versions, None, policy)
    assert [unbounded.check(g) for g in groups[:2]] == ["fresh", "fresh"]
    assert "rollout/staleness_dropped_groups" not in unbounded.metrics(groups[:2])
