"""The generic driver with a small in-test kind of rollout: scheduling, filters, stop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from miles_lite.errors import FilterError, GenerateError, RewardError
from miles_lite.pools.worker_pool import PoolWindow
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.driver import Driver
from miles_lite.rollout.filters import FilterResult, drop_aborted, drop_zero_std
from miles_lite.rollout.scoring import Scorer
from miles_lite.rollout.seeds import group_seeds
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample, SampleStatus

pytestmark = pytest.mark.anyio


class Kind:
    """Units of one sample; a unit 'generates' by sleeping ``delay(sample)`` seconds.

    On abort, units still generating come back ABORTED with partial output (as text
    engines answer an /abort_request).
    """

    def __init__(self, delay: Callable[[Sample], float], drain: bool = True) -> None:
        self.delay = delay
        self.drain_on_stop = drain
        self.sent: list[int] = []
        self.aborts = 0
        self.aborted = anyio.Event()

    def units(self, group: list[Sample]) -> list[list[Sample]]:
        return [[s] for s in group]

    async def generate(self, unit: list[Sample], span: UnitSpan, run: RunContext) -> list[Sample]:
        sample = unit[0]
        self.sent.append(sample.index)
        if sample.prompt == "raise":
            raise KeyError("boom")
        with anyio.move_on_after(self.delay(sample)):
            await self.aborted.wait()
            sample.status = SampleStatus.ABORTED
            sample.response = "partial"
            return unit
        sample.status = SampleStatus.COMPLETED
        sample.response = f"done {sample.index}"
        return unit

    async def abort(self, run: RunContext, *, alone: bool) -> dict[str, float]:
        self.aborts += 1
        self.aborted.set()
        return {"kind/aborted": 1.0}

    @contextmanager
    def measure(self) -> Iterator[Callable[[list[Sample], float], dict[str, float]]]:
        yield lambda kept, elapsed: {"kind/measured": 1.0, "kind/samples": float(len(kept))}


class Pool:
    """A reward 'pool' on the loop: ``fn(sample)`` per sample."""

    def __init__(self, name: str, fn: Callable[[Sample], Any]) -> None:
        self.name = name
        self.fn = fn
        self.calls = 0

    async def score(self, samples: list[Sample]) -> list[Any]:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        return [self.fn(s) for s in samples]

    @contextmanager
    def measure(self) -> Iterator[PoolWindow]:
        yield PoolWindow()


def groups_of(prompts: list[str], n: int = 2) -> list[list[Sample]]:
    return [
        [Sample(index=g * n + j, group_index=g, prompt=p) for j in range(n)]
        for g, p in enumerate(prompts)
    ]


def by_index(sample: Sample) -> float:
    return float(sample.index)


async def test_every_group_runs_and_is_scored_when_no_target_is_set() -> None:
    kind = Kind(lambda s: 0.0)
    driver = Driver(kind, Scorer({"r": Pool("r", by_index)}, reward="r", group_reward=None))
    result = await driver.run(groups_of(["a", "b", "c"]))
    assert [[s.index for s in g] for g in result.groups] == [[0, 1], [2, 3], [4, 5]]
    assert all(s.reward == float(s.index) for s in result.samples)
    assert result.partial == [] and result.filtered == []
    assert result.metrics["kind/measured"] == 1.0 and result.metrics["kind/samples"] == 6
    assert result.metrics["rollout/kept_groups"] == 3


async def test_oversampling_keeps_exactly_the_target_and_never_sends_the_rest() -> None:
    # Group 0 is dropped by the filter (zero std); groups finish in index order.
    kind = Kind(lambda s: 0.01 * s.group_index + (30.0 if s.group_index >= 3 else 0.0))
    rewards = {"r": Pool("r", lambda s: 1.0 if s.group_index == 0 else float(s.index % 2))}
    driver = Driver(kind, Scorer(rewards, reward="r", group_reward=None), filters=[drop_zero_std()])
    result = await driver.run(groups_of([f"p{g}" for g in range(8)]), target=2, batch_size=2)
    assert [g[0].group_index for g in result.groups] == [1, 2]
    assert [g[0].group_index for g in result.filtered] == [0]
    assert result.filter_reasons == ["drop_zero_std_1.0"]
    assert result.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 1
    # Batch 1 started groups 0-1; group 0 dropped -> batch 2 (2-3) started; never 4-7.
    assert sorted({i // 2 for i in kind.sent}) == [0, 1, 2, 3]
    partial = {g[0].group_index: g for g in result.partial}
    assert set(partial) == {3, 4, 5, 6, 7}
    # A slow group in flight came back aborted with partial output; unstarted ones pending.
    assert all(s.status is SampleStatus.ABORTED and s.response == "partial" for s in partial[3])
    assert all(s.status is SampleStatus.PENDING for s in partial[4])
    assert kind.aborts == 1
    # Rewards of work the rollout no longer needed were not computed.
    assert all(s.reward is None for s in partial[3])
    assert result.metrics["perf/stop_time"] < 5


async def test_partial_groups_resume_in_the_next_run() -> None:
    slow = {"slow"}
    kind = Kind(lambda s: 30.0 if s.prompt in slow else 0.0)
    driver = Driver(kind, Scorer({}, reward=None, group_reward=None))
    first = await driver.run(groups_of(["fast", "slow"]), target=1)
    assert [g[0].prompt for g in first.partial] == ["slow"]
    slow.clear()
    kind.aborted = anyio.Event()
    kind.sent.clear()
    second = await driver.run(first.partial)
    assert [s.status for s in second.samples] == [SampleStatus.COMPLETED] * 2
    assert kind.sent == [2, 3]


async def test_a_completed_sample_carried_over_is_not_generated_again() -> None:
    kind = Kind(lambda s: 0.0)
    pool = Pool("r", by_index)
    driver = Driver(kind, Scorer({"r": pool}, reward="r", group_reward=None))
    group = groups_of(["a"])[0]
    group[0].status = SampleStatus.COMPLETED
    group[0].reward = 7.0
    result = await driver.run([group])
    assert kind.sent == [1]
    assert [s.reward for s in result.samples] == [7.0, 1.0]


async def test_the_stop_is_bounded_when_work_never_comes_back() -> None:
    kind = Kind(lambda s: 0.0 if s.group_index == 0 else 3600.0)
    kind.abort = _never_returns  # type: ignore[method-assign]
    driver = Driver(kind, Scorer({}, reward=None, group_reward=None), stop_timeout_s=0.3)
    with anyio.fail_after(10):
        result = await driver.run(groups_of(["a", "b", "c"]), target=1, batch_size=3)
    assert len(result.groups) == 1 and len(result.partial) == 2
    assert 0.25 < result.metrics["perf/stop_time"] < 3


async def _never_returns(run: RunContext, *, alone: bool) -> dict[str, float]:
    await anyio.sleep_forever()
    return {}


async def test_a_filter_that_raises_fails_its_group_only() -> None:
    def picky(group: list[Sample]) -> bool:
        if group[0].prompt == "bad":
            raise ValueError("cannot judge")
        return True

    driver = Driver(
        Kind(lambda s: 0.0), Scorer({}, reward=None, group_reward=None), filters=[picky]
    )
    result = await driver.run(groups_of(["ok", "bad", "ok2"]))
    assert [g[0].prompt for g in result.groups] == ["ok", "ok2"]
    assert result.filter_reasons == ["drop_filter_error"]
    (bad,) = result.filtered
    assert all(isinstance(s.error, FilterError) for s in bad)
    assert isinstance(bad[0].error.__cause__, ValueError)  # type: ignore[union-attr]


async def test_a_group_reward_or_reward_that_raises_fails_its_samples_only() -> None:
    def group_fn(sample: Sample) -> float:
        if sample.prompt == "bad":
            raise ZeroDivisionError("no")
        return 1.0

    scorer = Scorer({"g": Pool("g", group_fn)}, reward=None, group_reward="g")
    result = await Driver(Kind(lambda s: 0.0), scorer).run(groups_of(["ok", "bad"]))
    ok, bad = result.groups
    assert all(s.reward == 1.0 for s in ok)
    assert all(isinstance(s.error, RewardError) for s in bad)
    assert isinstance(bad[0].error.__cause__, ZeroDivisionError)  # type: ignore[union-attr]


async def test_a_generate_function_that_raises_keeps_its_traceback() -> None:
    result = await Driver(Kind(lambda s: 0.0), Scorer({}, reward=None, group_reward=None)).run(
        groups_of(["raise", "fine"])
    )
    failed = result.groups[0][0]
    assert isinstance(failed.error, GenerateError) and "KeyError" in str(failed.error)
    cause = failed.error.__cause__
    assert isinstance(cause, KeyError) and cause.__traceback__ is not None
    assert all(s.status is SampleStatus.COMPLETED for s in result.groups[1])


async def test_filters_may_return_a_result_with_a_reason() -> None:
    def odd(group: list[Sample]) -> FilterResult:
        return FilterResult(group[0].group_index % 2 == 0, "odd_group")

    driver = Driver(
        Kind(lambda s: 0.0), Scorer({}, reward=None, group_reward=None), filters=[drop_aborted, odd]
    )
    result = await driver.run(groups_of(["a", "b", "c"]))
    assert result.filter_reasons == ["drop_odd_group"]
    assert result.metrics["rollout/dynamic_filter/drop_odd_group"] == 1


def test_seeds_differ_across_rollouts_and_groups_and_repeat_for_a_rollout_id() -> None:
    first = [group_seeds(0, rollout_id=0, group=g, n_samples=4) for g in range(50)]
    second = [group_seeds(0, rollout_id=1, group=g, n_samples=4) for g in range(50)]
    assert first == [group_seeds(0, rollout_id=0, group=g, n_samples=4) for g in range(50)]
    every = [s for g in first + second for s in g]
    assert len(set(every)) == len(every)
    assert all(0 <= s < 2**31 for s in every)
    assert all(g == list(range(g[0], g[0] + 4)) for g in first)
    assert group_seeds(1, 0, 0, 4) != first[0]


async def test_cancelling_the_run_aborts_the_engines_and_propagates() -> None:
    kind = Kind(lambda s: 3600.0)
    driver = Driver(kind, Scorer({}, reward=None, group_reward=None), stop_timeout_s=1.0)
    with anyio.move_on_after(0.2):
        await driver.run(groups_of(["a", "b"]))
    assert kind.aborts == 1


async def test_groups_start_as_earlier_ones_finish_under_max_started_samples() -> None:
    running = peak = 0

    class Counting(Kind):
        async def generate(
            self, unit: list[Sample], span: UnitSpan, run: RunContext
        ) -> list[Sample]:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                return await super().generate(unit, span, run)
            finally:
                running -= 1

    kind = Counting(lambda s: 0.01)
    driver = Driver(kind, Scorer({}, reward=None, group_reward=None), max_started_samples=5)
    result = await driver.run(groups_of([f"p{i}" for i in range(10)]))
    assert len(result.groups) == 10 and all(
        s.status is SampleStatus.COMPLETED for s in result.samples
    )
    assert peak == 4  # two groups of 2; a third would make 6 > 5
    # A group larger than the bound still runs (alone).
    big = await Driver(
        Kind(lambda s: 0.0), Scorer({}, reward=None, group_reward=None), max_started_samples=1
    ).run(groups_of(["a", "b"], n=3))
    assert len(big.samples) == 6
    with pytest.raises(ValueError, match="max_started_samples"):
        Driver(kind, Scorer({}, reward=None, group_reward=None), max_started_samples=0)


async def test_units_run_on_reused_workers_not_a_task_each() -> None:
    """A unit is handed to an idle worker; a new one starts only when none is idle: a
    run of 240 units, at most 8 samples started at once, creates at most 8 tasks (it
    made a task per group and per unit: 301). An empty group ends at once, kept empty."""
    import asyncio

    created = 0
    loop = asyncio.get_running_loop()

    def counting_factory(
        loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any
    ) -> asyncio.Task[Any]:
        nonlocal created
        created += 1
        return asyncio.Task(coro, loop=loop, **kw)

    kind = Kind(lambda s: 0.001 * (s.index % 3))
    driver = Driver(
        kind,
        Scorer({"r": Pool("r", by_index)}, reward="r", group_reward=None),
        max_started_samples=8,
    )
    groups = groups_of([f"p{i}" for i in range(60)], n=4)
    groups.insert(7, [])
    previous = loop.get_task_factory()
    loop.set_task_factory(counting_factory)
    try:
        result = await driver.run(groups)
    finally:
        loop.set_task_factory(previous)
    assert len(result.groups) == 61 and [] in result.groups
    assert sorted(kind.sent) == list(range(240))
    assert all(s.reward == float(s.index) for s in result.samples)
    assert created <= 8


async def test_groups_that_end_together_complete_the_run_without_a_stop() -> None:
    # Every group ends in one loop iteration, before the scheduler counts any end: the
    # target is met with ends still queued, and nothing runs that a stop could abort.
    kind = Kind(lambda s: 0.0)
    driver = Driver(kind, Scorer({}, reward=None, group_reward=None))
    result = await driver.run(groups_of(["a", "b", "c"]), batch_size=3)
    assert len(result.groups) == 3 and result.partial == []
    assert kind.aborts == 0 and "perf/stop_time" not in result.metrics
