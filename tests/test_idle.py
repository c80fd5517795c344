"""Reused workers' hand-over (``_core/idle.py``): a job goes to a waiting worker, never to
one whose wait was cancelled; with none waiting the caller is told to start one; release
ends every waiting worker."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from miles_lite._core.idle import IdleWorkers

pytestmark = pytest.mark.anyio


async def test_jobs_go_to_waiting_workers_and_release_ends_them() -> None:
    idle: IdleWorkers[str] = IdleWorkers()
    assert not idle.hand("nobody waits")
    got: list[str | None] = []

    async def worker() -> None:
        while (job := await idle.wait()) is not None:
            got.append(job)

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(worker)
        await anyio.wait_all_tasks_blocked()
        assert idle.hand("a") and idle.hand("b")
        assert not idle.hand("c")  # both busy until they run
        await anyio.wait_all_tasks_blocked()
        idle.release()  # both waiting again: both end
    assert sorted(got) == ["a", "b"]
    assert not idle.hand("after")


async def test_a_cancelled_wait_is_skipped() -> None:
    idle: IdleWorkers[int] = IdleWorkers()
    cancelled = idle.wait()
    cancelled.cancel()
    waiting = idle.wait()
    assert idle.hand(1)
    assert waiting.result() == 1 and cancelled.cancelled()
    assert not idle.hand(2)
    assert isinstance(waiting, asyncio.Future)
