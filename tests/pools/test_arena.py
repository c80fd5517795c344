from __future__ import annotations

import os

import anyio
import pytest
import torch

from miles_lite.errors import ArenaFullError, ClosedResourceError, ConfigError
from miles_lite.pools.arena import Arena, ArenaConfig
from miles_lite.pools.worker_arena import WorkerArena
from tests.garbage import collect_garbage
from tests.leaks import leaked_shm, shm_entries

pytestmark = pytest.mark.anyio

PAGE = 4096


def memfds() -> int:
    return sum(
        "miles_lite_arena" in os.readlink(f"/proc/self/fd/{fd}")
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    )


async def test_held_tensor_is_never_overwritten_and_released_space_is_reused() -> None:
    async with Arena(ArenaConfig(size_bytes=8 * PAGE, page_bytes=PAGE)) as arena:
        lease = await arena.lease(3 * PAGE)
        held = torch.frombuffer(lease.array, dtype=torch.float32)
        held.fill_(7.0)
        first = lease.allocation.first_page
        del lease
        # Later allocations fill the rest of the arena and are scribbled on.
        others = [await arena.lease(PAGE) for _ in range(5)]
        for other in others:
            assert not set(
                range(other.allocation.first_page, other.allocation.first_page + 1)
            ) & set(range(first, first + 3))
            other.view[:] = b"\xff" * PAGE
        assert torch.all(held == 7.0)
        assert arena.try_lease(PAGE) is None  # full while the tensor is held
        del held
        await collect_garbage()
        again = arena.try_lease(3 * PAGE)
        assert again is not None and again.allocation.first_page == first


async def test_full_arena_applies_backpressure_until_space_is_released() -> None:
    async with Arena(ArenaConfig(size_bytes=2 * PAGE, page_bytes=PAGE)) as arena:
        holder = [await arena.lease(2 * PAGE)]
        got: list[int] = []

        async def wants_space() -> None:
            lease = await arena.lease(PAGE)
            got.append(lease.allocation.first_page)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wants_space)
            await anyio.sleep(0.05)
            assert got == []  # still waiting
            assert arena.waits == 1
            holder.clear()
            await collect_garbage()
        assert got == [0]


async def test_allocation_times_out_with_a_clear_error() -> None:
    cfg = ArenaConfig(size_bytes=PAGE, page_bytes=PAGE, wait_s=0.05)
    async with Arena(cfg) as arena:
        held = await arena.lease(PAGE)
        with pytest.raises(ArenaFullError, match="no 1 bytes free"):
            await arena.lease(1)
        with pytest.raises(ArenaFullError, match="exceeds the arena"):
            await arena.lease(2 * PAGE)
        held.release()
        assert arena.used_bytes == 0


async def test_worker_side_allocation_is_adopted_shrunk_and_reclaimed() -> None:
    async with Arena(ArenaConfig(size_bytes=8 * PAGE, page_bytes=PAGE)) as arena:
        worker = WorkerArena(arena.handle, tag=5)
        alloc = worker.alloc(4 * PAGE, timeout_s=1)
        worker.view(alloc)[:4] = b"abcd"
        lease = arena.adopt(alloc, used_bytes=PAGE + 1)
        assert bytes(lease.view[:4]) == b"abcd"
        assert arena.used_bytes == 2 * PAGE
        # A dead worker's pages come back.
        worker.alloc(3 * PAGE, timeout_s=1)
        assert arena.reclaim(5) == 3
        assert arena.used_bytes == 2 * PAGE
        lease.release()
        assert arena.used_bytes == 0


async def test_nothing_is_left_after_close_even_while_tensors_live() -> None:
    await collect_garbage()
    before_shm = shm_entries()
    before = memfds()
    arena = await Arena.create(ArenaConfig(size_bytes=4 * PAGE, page_bytes=PAGE))
    assert memfds() > before
    lease = await arena.lease(PAGE)
    t = torch.frombuffer(lease.array, dtype=torch.uint8)
    t[:] = 3
    del lease
    await arena.aclose()
    # The memory lives on with the tensor, then goes with it.
    assert int(t.sum()) == 3 * PAGE
    with pytest.raises(ClosedResourceError):
        await arena.lease(1)
    del t, arena
    await collect_garbage()
    assert memfds() == before
    assert leaked_shm(before_shm) == set()  # only what this test left counts


def test_config_names_the_bad_field() -> None:
    with pytest.raises(ConfigError, match="page_bytes"):
        ArenaConfig(page_bytes=1000)
    with pytest.raises(ConfigError, match="size_bytes"):
        ArenaConfig(size_bytes=10, page_bytes=4096)
