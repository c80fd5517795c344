"""Faults of the worker and reward pools: each test fails on the code before its fix."""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from miles_lite.errors import RewardError, WorkerCrashedError, WorkerTimeoutError
from miles_lite.pools.reward_pool import RewardPool
from miles_lite.pools.worker_pool import PoolWindows, WorkerPool
from miles_lite.types import Sample
from tests.pools import work

pytestmark = pytest.mark.anyio


def test_two_equal_windows_are_removed_by_identity() -> None:
    # Two empty windows are equal by value: closing the second must not close the first.
    windows = PoolWindows()
    cm_first = windows.measure()
    first = cm_first.__enter__()
    cm_second = windows.measure()
    second = cm_second.__enter__()
    assert first == second and first is not second
    cm_second.__exit__(None, None, None)
    windows.dispatched(3)
    assert first.calls == 1 and first.max_queue_depth == 3
    assert second.calls == 0
    cm_first.__exit__(None, None, None)


async def test_a_call_goes_to_an_idle_worker_not_behind_a_long_one() -> None:
    async with WorkerPool("t", workers=2) as pool:
        with pool.measure() as window:
            async with anyio.create_task_group() as tg:
                tg.start_soon(pool.run, work.slow, 1.0, 0)  # a long fetch on worker 0
                await anyio.sleep(0.05)
                for _ in range(3):  # round-robin would send the 2nd of these behind it
                    start = time.monotonic()
                    await pool.run(work.slow, 0, 1)
                    assert time.monotonic() - start < 0.5
        assert window.max_queue_depth == 0


async def test_a_cancelled_call_still_counts_until_it_ends() -> None:
    async with WorkerPool("t", workers=2) as pool:
        with anyio.move_on_after(0.1):
            await pool.run_on(0, work.slow, 0.8, 0)
        assert pool.statistics().in_flight == (1, 0)  # still running in worker 0
        assert pool.pick() == 1
        await anyio.sleep(1.0)
        assert pool.statistics().in_flight == (0, 0)


async def test_a_replacement_dying_while_starting_is_typed_and_the_pool_recovers(
    tmp_path: Path,
) -> None:
    marker = str(tmp_path / "die")
    async with WorkerPool(
        "t", workers=1, initializer=_init_die_if, initargs_for=lambda _i: (marker,)
    ) as pool:
        await anyio.Path(marker).touch()
        with pytest.raises(WorkerCrashedError, match="died while running"):
            await pool.run(work.die)
        with pytest.raises(WorkerCrashedError, match="died while starting"):
            await pool.run(work.pid)
        await anyio.Path(marker).unlink()
        assert await pool.run(work.slow, 0, 7) == 7
        assert pool.statistics().in_flight == (0,)


def _init_die_if(index: int, marker: str) -> None:
    work.die_on_start_if(marker)


async def test_a_call_past_its_timeout_kills_and_replaces_the_worker() -> None:
    async with WorkerPool("t", workers=1) as pool:
        old = await pool.run(work.pid)
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match=r"0\.5 s"):
            await pool.run(work.slow, 60, 0, timeout_s=0.5)
        assert time.monotonic() - start < 5
        assert await pool.run(work.slow, 0, 3) == 3
        assert await pool.run(work.pid) != old
        with pytest.raises(ProcessLookupError):
            os.kill(old, 0)


def _samples(n: int) -> list[Sample]:
    return [Sample(index=i, group_index=0, prompt="p", label="4", response="4") for i in range(n)]


async def test_a_hung_reward_fails_with_its_timeout_and_the_pool_goes_on() -> None:
    async with RewardPool("hang", work.hang_reward, timeout_s=0.5) as pool:
        start = time.monotonic()
        with pytest.raises(RewardError, match=r"timeout of 0\.5 s"):
            await pool.score(_samples(2))
        assert time.monotonic() - start < 5
    async with RewardPool("ok", work.text_reward, timeout_s=30) as pool:
        assert await pool.score(_samples(1)) == [{"score": 1.0, "len": 1}]


async def test_a_nan_reward_is_refused_naming_the_sample_and_value() -> None:
    async with RewardPool("nan", work.nan_reward) as pool:
        with pytest.raises(RewardError, match=r"nan for sample 1"):
            await pool.score(_samples(3))


async def test_a_reward_error_names_the_users_function_not_the_wrapper() -> None:
    async with RewardPool("f", work.failing_reward) as pool:
        with pytest.raises(RewardError) as info:
            await pool.score(_samples(1))
    assert "failing_reward" in str(info.value) and "_score" not in str(info.value)


def _one_thread(initializer: Any, initargs: tuple[Any, ...]) -> Executor:
    return ThreadPoolExecutor(1, initializer=initializer, initargs=initargs)


async def test_any_executor_works_a_thread_pool_scores_text_samples() -> None:
    pid, nice = os.getpid(), os.nice(0)
    async with RewardPool("thr", work.text_reward, executor_factory=_one_thread) as pool:
        scores = await pool.score(_samples(2))
        assert scores == [{"score": 1.0, "len": 1}] * 2
    async with WorkerPool("thr", workers=2, executor_factory=_one_thread) as wp:
        assert await wp.run(work.pid) == pid
        assert os.nice(0) == nice  # the owner's priority is untouched
