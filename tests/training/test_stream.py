"""rollout.stream(): kept groups reach the trainer as they finish, never more than
max_ahead groups ahead of it; early stop, leaving the block and cancellation stop the run
as run() does, and unfinished groups come back as partial."""

from __future__ import annotations

import anyio
import pytest

from miles_lite import SampleStatus
from miles_lite.errors import ConfigError
from miles_lite.types import Sample
from tests.support.polling import wait_until

from .conftest import OpenScripted

pytestmark = pytest.mark.anyio


async def test_groups_arrive_as_they_finish_and_a_slow_trainer_holds_new_starts(
    scripted_rollout: OpenScripted,
) -> None:
    async with scripted_rollout(n_samples_per_prompt=2) as (rollout, engine):
        seen: list[tuple[int, int, int]] = []
        async with rollout.stream([f"prompt {i}" for i in range(6)], max_ahead=2) as groups:
            async for group in groups:
                stats = groups.statistics()
                sent = len({r["rid"] for r in engine.statistics().requests})
                seen.append((group[0].group_index, stats.started, sent))
                await anyio.sleep(0.05)  # a slow trainer step
                # While it trained, nothing more started: 2 groups ahead at most.
                assert groups.statistics().started <= stats.delivered + 2
        result = groups.result
    assert [g for g, _, _ in seen] == sorted(g for g, _, _ in seen) and len(seen) == 6
    started_at_first, sent_at_first = seen[0][1], seen[0][2]
    assert started_at_first <= 2 and sent_at_first <= 4  # the rest had not started
    assert all(sent <= 2 * (i + 2) for i, (_, _, sent) in enumerate(seen))
    assert len(result.groups) == 6 and result.partial == []
    metrics = result.metrics
    assert metrics["rollout/stream_max_ahead"] <= 2 and metrics["rollout/stream_max_buffered"] <= 2
    assert metrics["rollout/stream_delivered_groups"] == 6.0
    assert metrics["rollout/staleness_max"] == 0.0
    # Like run()'s: the engines (a trace draws idle ones too), the run's times, the prompts.
    assert result.engines == (engine.url,) and metrics["rollout/prompts"] == 6.0
    assert 0.0 < result.times.start < result.times.end


async def test_a_group_a_filter_drops_frees_its_place(scripted_rollout: OpenScripted) -> None:
    def odd_only(group: list[Sample]) -> bool:
        return group[0].group_index % 2 == 1

    async with (
        scripted_rollout(dynamic_filter=odd_only) as (rollout, _),
        rollout.stream([f"p{i}" for i in range(4)], max_ahead=1) as groups,
    ):
        got = [group[0].group_index async for group in groups]
    assert got == [1, 3] and groups.statistics().started == 4
    assert groups.result.filter_reasons == ["drop_filtered", "drop_filtered"]


async def test_enough_kept_groups_stop_the_stream_and_the_rest_comes_back(
    scripted_rollout: OpenScripted,
) -> None:
    async with scripted_rollout(
        answer_tokens=200,
        token_latency_s=0.005,
        rollout_batch_size=2,
        over_sampling_batch_size=4,
    ) as (rollout, engine):
        async with rollout.stream(["a", "b", "c", "d"], max_ahead=4) as groups:
            got = [g async for g in groups]
        assert engine.stats.running == 0
    result = groups.result
    assert len(got) == 2 and len(result.groups) == 2
    assert sum(len(g) for g in result.partial) + sum(len(g) for g in result.groups) == 16
    assert result.metrics["rollout/partial_groups"] == 2.0


async def test_an_error_in_the_trainer_aborts_what_runs_and_goes_on_unwrapped(
    scripted_rollout: OpenScripted,
) -> None:
    async with scripted_rollout(answer_tokens=400, token_latency_s=0.005) as (rollout, engine):
        with pytest.raises(ValueError, match="trainer failed"):
            async with rollout.stream(["a", "b", "c"], max_ahead=2) as groups:
                await wait_until(lambda: engine.stats.generated_tokens >= 10)
                raise ValueError("trainer failed")
        assert engine.stats.running == 0 and engine.stats.aborts
    result = groups.result
    assert result.groups == [] and len(result.partial) == 3
    partial = [s for g in result.partial for s in g]
    assert {s.status for s in partial} == {SampleStatus.ABORTED, SampleStatus.PENDING}
    assert any(s.response_length > 0 for s in partial)  # partial output, to resume


async def test_breaking_out_after_the_first_group_stops_the_run(
    scripted_rollout: OpenScripted,
) -> None:
    async with scripted_rollout(answer_tokens=4, token_latency_s=0.002) as (rollout, engine):
        async with rollout.stream(
            ["short"] + [f"long {i}" for i in range(5)], max_ahead=3
        ) as groups:
            async for group in groups:
                first = group
                break
        assert engine.stats.running == 0 and engine.stats.waiting == 0
    result = groups.result
    assert result.groups == [first]
    # Finished but not taken, running (aborted) or never started: all come back.
    assert len(result.groups) + len(result.partial) == 6
    statuses = {s.status for g in result.partial for s in g}
    assert statuses <= {SampleStatus.COMPLETED, SampleStatus.ABORTED, SampleStatus.PENDING}


async def test_cancelling_the_trainer_stops_the_engines_work(
    scripted_rollout: OpenScripted,
) -> None:
    async with scripted_rollout(answer_tokens=1000, token_latency_s=0.005) as (rollout, engine):
        with anyio.move_on_after(0.3):
            async with rollout.stream(["a", "b"], max_ahead=2) as groups:
                async for _ in groups:
                    pass
        assert engine.stats.running == 0 and engine.stats.aborts
        with pytest.raises(RuntimeError, match="once its async with block exited"):
            _ = groups.result
        with pytest.raises(ConfigError, match="max_ahead"):
            rollout.stream(["a"], max_ahead=0)
        stream = rollout.stream(["a"])
        with pytest.raises(RuntimeError, match="inside its async with"):
            await stream.__anext__()
