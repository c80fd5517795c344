from __future__ import annotations

import os

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_lite.errors import ClosedResourceError, ConfigError, WorkerCrashedError, WorkerTaskError
from miles_lite.pools.worker_pool import WorkerPool, process_executor_factory
from tests.pools import work

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pool():
    async with WorkerPool("test", workers=2) as p:
        yield p


async def test_round_robin_alternates_workers(pool: WorkerPool) -> None:
    pids = [await pool.run(work.pid) for _ in range(4)]
    assert pids[0] == pids[2] and pids[1] == pids[3] and pids[0] != pids[1]


async def test_queue_depth_is_zero_when_idle_and_grows_when_saturated(pool: WorkerPool) -> None:
    with pool.measure() as idle:
        for _ in range(4):
            await pool.run(work.slow, 0, 1)
    assert idle.calls == 4 and idle.max_queue_depth == 0
    with pool.measure() as busy:
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(pool.run, work.slow, 0.05, i)
    assert busy.calls == 6 and busy.max_queue_depth == 2


async def test_a_raising_function_gives_a_task_error_with_the_remote_traceback(
    pool: WorkerPool,
) -> None:
    with pytest.raises(WorkerTaskError, match="KeyError") as info:
        await pool.run(work.boom, "bad key")
    assert "bad key" in info.value.remote_traceback
    assert await pool.run(work.slow, 0, 5) == 5  # the pool goes on


async def test_a_dead_worker_is_reported_and_replaced() -> None:
    crashed: list[int] = []
    async with WorkerPool("test", workers=2, on_crash=crashed.append) as pool:
        first = await pool.run_on(0, work.pid)
        with pytest.raises(WorkerCrashedError, match="worker 0"):
            await pool.run_on(0, work.die)
        assert crashed == [0] and pool.statistics().crashes == 1
        replacement = await pool.run_on(0, work.pid)
        assert replacement != first
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)


async def test_workers_use_one_torch_thread(pool: WorkerPool) -> None:
    assert await pool.run(work.torch_threads) == 1


async def test_closures_and_lambdas_run_by_value(pool: WorkerPool) -> None:
    offset = 10
    assert await pool.run(lambda x: x + offset, 5) == 15


async def test_close_stops_every_worker_and_refuses_use() -> None:
    pool = WorkerPool("test", workers=2)
    await pool.start()
    pids = [await pool.run_on(i, work.pid) for i in range(2)]
    await pool.aclose()
    for p in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    with pytest.raises(ClosedResourceError):
        await pool.run(work.pid)


async def test_cancelled_call_hands_its_late_result_over(pool: WorkerPool) -> None:
    late: list[int] = []
    with anyio.move_on_after(0.05):
        await pool.run_on(0, work.slow, 0.3, 42, after_cancel=late.append)
    await anyio.sleep(0.6)
    assert late == [42]


def test_fork_is_refused() -> None:
    with pytest.raises(ConfigError, match="fork"):
        process_executor_factory("fork")
    with pytest.raises(ConfigError, match="workers"):
        WorkerPool("x", workers=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 7), st.integers(0, 40))
def test_round_robin_is_fair(workers: int, calls: int) -> None:
    pool = WorkerPool("fair", workers=workers)
    picks = [pool.pick() for _ in range(calls)]
    counts = [picks.count(i) for i in range(workers)]
    assert max(counts) - min(counts) <= 1


async def test_workers_yield_the_cores_to_the_event_loop(pool: WorkerPool) -> None:
    assert await pool.run(work.niceness) == os.nice(0) + 10
