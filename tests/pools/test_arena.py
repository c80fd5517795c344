from __future__ import annotations

import functools
import os
import time

import anyio
import pytest
import torch

from miles_lite.errors import ArenaFullError, ClosedResourceError, ConfigError
from miles_lite.pools import arena_pages
from miles_lite.pools.arena import Arena, ArenaConfig
from miles_lite.pools.worker_arena import WorkerArena
from tests.support.garbage import collect_garbage
from tests.support.leaks import leaked_shm, shm_entries

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
    for bad in (-1, 8 << 20, 1.5, True):
        with pytest.raises(ConfigError, match="populate_bytes"):
            ArenaConfig(size_bytes=4 << 20, populate_bytes=bad)  # type: ignore[arg-type]


MIB = 1 << 20


def faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.parametrize(
    ("populate", "populate_bytes", "faulted"),
    [(True, None, 32 * MIB), (True, 8 * MIB, 8 * MIB), (False, None, 0)],
)
@pytest.mark.parametrize("kernel", ["madvise", "older"])
async def test_memory_is_taken_only_for_the_populated_bytes(
    populate: bool,
    populate_bytes: int | None,
    faulted: int,
    kernel: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memfd's allocated bytes (st_blocks) are what was pre-faulted, the page table
    included; a worker that attaches faults in the same bytes and no more; the headroom
    past them costs memory only once written. "older": a kernel without
    MADV_POPULATE_WRITE (an advice it refuses), where pages are touched by reading."""
    if kernel == "older":
        monkeypatch.setattr(arena_pages, "_MADV_POPULATE_WRITE", 1 << 20)
    config = ArenaConfig(size_bytes=32 * MIB, populate=populate, populate_bytes=populate_bytes)
    async with Arena(config) as arena:
        fd = arena.handle.fd

        def allocated() -> int:
            return os.fstat(fd).st_blocks * 512

        table = arena.handle.data_offset
        assert faulted <= allocated() <= faulted + table
        worker = WorkerArena(arena.handle, tag=2)
        assert faulted <= allocated() <= faulted + table
        # Written through the worker's mapping: the pre-faulted bytes take no page fault,
        # the rest one a page.
        alloc = worker.alloc(16 * MIB, timeout_s=1)
        view = worker.view(alloc)
        ones = b"\x01" * (4 * MIB)  # written once, so reading it faults nothing
        before = faults()
        view[: 4 * MIB] = ones
        early = faults() - before
        before = faults()
        view[12 * MIB : 16 * MIB] = ones
        late = faults() - before
        if faulted >= 16 * MIB:
            assert late < 64
        else:
            assert late >= 4 * MIB // os.sysconf("SC_PAGE_SIZE")  # no huge pages for memfd here
            assert allocated() >= faulted + 4 * MIB
        if faulted:
            assert early < 64
        view.release()
        arena.adopt(alloc, used_bytes=16 * MIB).release()


async def test_closing_unmaps_off_the_loop_and_gives_back_what_nobody_holds() -> None:
    """Unmapping a populated arena costs the kernel about 0.2 s of CPU a GiB: the close
    does it in a worker thread, and with a tensor still viewing one page, every other page
    goes back to the kernel at the close (the memfd's allocated bytes), so the unmap when
    that tensor is collected, wherever it is, costs only its page. A worker attached
    before the close allocates nothing after it."""
    config = ArenaConfig(size_bytes=256 * MIB)
    arena = await Arena.create(config)
    fd = os.dup(arena.handle.fd)
    try:
        worker = WorkerArena(arena.handle, tag=2)
        lease = await arena.lease(PAGE)
        t = torch.frombuffer(lease.array, dtype=torch.uint8)
        t[:] = 7
        del lease
        assert os.fstat(fd).st_blocks * 512 >= 256 * MIB
        loop_before, process_before = time.thread_time(), time.process_time()
        await arena.aclose()
        loop_cpu = time.thread_time() - loop_before
        process_cpu = time.process_time() - process_before
        # CPU times, not wall time: the unmap's work is the process's, not the loop's.
        assert loop_cpu < process_cpu / 4, (loop_cpu, process_cpu)
        allocated = os.fstat(fd).st_blocks * 512
        assert allocated <= 2 * config.page_bytes, allocated  # the page table and t's page
        assert int(t.sum()) == 7 * PAGE
        with pytest.raises(ArenaFullError):  # a worker's wait sleeps: off the loop
            await anyio.to_thread.run_sync(functools.partial(worker.alloc, PAGE, timeout_s=0.05))
        del t, worker
        await collect_garbage()
    finally:
        os.close(fd)
