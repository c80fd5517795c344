"""A pre-faulted shared-memory arena that parser workers write tensors into.

Why: handing decoded tensors from a worker to the main process through the result pipe
(pickle) runs at 0.13-0.27 GB/s; a new shared-memory segment per response at ~1.3 GB/s
(page faults); a pre-faulted arena reused across responses at ~12 GB/s (PERF_FACTS.md).

How:
- One ``memfd`` (anonymous shared memory) holds a page table and ``size_bytes`` of data
  pages. Nothing is ever created in ``/dev/shm``: the memory is freed by the kernel when
  the last process holding it exits or unmaps it, whatever way it ends. Workers attach
  through ``/proc/<pid>/fd/<fd>`` (Linux) and map it with ``MAP_POPULATE``.
- The page table has one byte per data page: 0 free, 1 owned by the main process,
  2..255 owned by the worker with that tag (allocated by it, not yet handed over). It is
  changed only under ``flock`` on the memfd (released by the kernel if a holder dies), so
  workers allocate for themselves, and the main process frees when the user lets go.
- A :class:`Lease` is a numpy byte view of an allocation; tensors made from it with
  ``torch.frombuffer`` keep it alive, and when the last one is garbage-collected the
  pages return to the table. Nothing the user holds is ever overwritten. The collector
  may run anywhere, also inside a page-table change holding its lock: a finalizer only
  queues the free (a lock-free deque append) and asks the arena's event loop to drain the
  queue (``call_soon_threadsafe``, once per batch of frees). So the pages reach the
  shared table within one loop iteration, whichever process allocates next: with
  ``fetch_in_parser`` only workers allocate, and the main process never would. Without a
  running loop the queue is drained at the next allocation, free or ``used_bytes``
  reading.
- Backpressure: an allocation that does not fit waits (the main process asynchronously,
  a worker by polling) until pages are released, up to a timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import mmap
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from miles_lite._core.resources import AsyncResource
from miles_lite._core.validate import check_int
from miles_lite.errors import ArenaFullError, ConfigError
from miles_lite.pools.arena_pages import (
    PARENT,
    Allocation,
    ArenaHandle,
    ArenaTensor,
    PageTable,
    map_shared,
)

__all__ = ["Arena", "ArenaConfig", "ArenaStatistics", "Lease"]


@dataclass(frozen=True, kw_only=True)
class ArenaConfig:
    """Size of the shared-memory arena.

    ``size_bytes`` bounds the tensor bytes in flight plus those the user still holds: size
    it to hold what you keep (a rollout's tensors, say). An allocation that does not fit
    waits up to ``wait_s`` for released space (backpressure), then raises
    :class:`ArenaFullError`; a rollout then spills that body to private memory instead
    (slower: its tensors are copied or pickled once) and counts it in
    ``perf/arena_spills``. ``page_bytes`` is the allocation unit (a power of two, at
    least 4 KiB). ``populate`` maps the pages at creation, in the main process and in every
    worker that attaches (no page faults later); ``populate_bytes`` limits that to the
    arena's first bytes (None: all of it). Allocations take the lowest free pages, so an
    arena sized with headroom and populated for what a rollout usually holds costs memory
    only for the headroom it uses (its pages are faulted on first use, then stay).

    Usage: ``ArenaConfig(size_bytes=4 << 30)``.
    """

    size_bytes: int = 1 << 30
    page_bytes: int = 64 << 10
    wait_s: float = 2.0
    populate: bool = True
    populate_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.page_bytes < 4096 or self.page_bytes & (self.page_bytes - 1):
            raise ConfigError(
                f"ArenaConfig.page_bytes must be a power of two >= 4096, got {self.page_bytes}"
            )
        if self.size_bytes < self.page_bytes:
            raise ConfigError(
                f"ArenaConfig.size_bytes must be >= page_bytes, got {self.size_bytes}"
            )
        if (self.size_bytes // self.page_bytes) > (1 << 24):
            raise ConfigError("ArenaConfig: more than 16M pages; raise page_bytes")
        if not self.wait_s >= 0:
            raise ConfigError(f"ArenaConfig.wait_s must be >= 0, got {self.wait_s}")
        check_int("ArenaConfig", "populate_bytes", self.populate_bytes, minimum=0, optional=True)
        if self.populate_bytes is not None and self.populate_bytes > self.size_bytes:
            raise ConfigError(
                f"ArenaConfig.populate_bytes must be <= size_bytes ({self.size_bytes}), got "
                f"{self.populate_bytes}"
            )

    @property
    def prefault_bytes(self) -> int:
        """Bytes of the data area pre-faulted at creation."""
        if not self.populate:
            return 0
        return self.size_bytes if self.populate_bytes is None else self.populate_bytes


class Lease:
    """An allocation the main process owns; its pages are freed when nothing uses it.

    ``array`` is a numpy ``uint8`` view of the bytes; tensors built on it with
    ``torch.frombuffer`` keep it (and so the pages) alive. :meth:`release` frees at once
    when the caller knows nothing refers to the bytes any more.
    """

    __slots__ = ("__weakref__", "_finalizer", "allocation", "array")

    def __init__(
        self, array: np.ndarray, allocation: Allocation, on_free: weakref.finalize[Any, Any]
    ) -> None:
        self.array = array
        self.allocation = allocation
        self._finalizer = on_free

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the leased bytes."""
        return self.array.data

    def release(self) -> None:
        """Free the pages now; the caller promises no tensor views them any more."""
        info = self._finalizer.peek()
        self._finalizer()
        if info is not None:
            arena: Arena = info[2][0]
            arena._drain()


@dataclass(frozen=True, slots=True)
class ArenaStatistics:
    """An arena now: ``used_bytes`` held (main process and workers), ``size_bytes``, and
    ``waits``: allocations that found no room and waited."""

    used_bytes: int
    size_bytes: int
    waits: int


class Arena(AsyncResource):
    """The main process's side of a shared-memory arena (see the module docstring).

    ``async with Arena(config) as arena`` (or ``await Arena.create(config)``, closed with
    :meth:`aclose`) maps and pre-faults the memory off the event loop. After close,
    tensors the user still holds stay valid and their pages go when they do; the rest go
    back to the kernel at the close (in a worker thread, as the unmap).
    """

    _resource_name = "arena"

    def __init__(self, config: ArenaConfig) -> None:
        super().__init__()
        self.config = config
        self.n_pages = config.size_bytes // config.page_bytes
        self._data_offset = math.ceil(self.n_pages / config.page_bytes) * config.page_bytes
        # Frees queued by finalizers (see the module docstring); drained under the lock.
        self._pending_frees: collections.deque[tuple[int, int]] = collections.deque()
        self.waits = 0
        self._loop_thread = threading.get_ident()
        # The loop finalizers hand their frees to (see _queue_free); set when opened.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False

    @classmethod
    async def create(cls, config: ArenaConfig | None = None) -> Arena:
        """An open arena (mapped and pre-faulted in a worker thread: seconds for several
        GB); close it with :meth:`aclose`."""
        arena = cls(config or ArenaConfig())
        await arena.__aenter__()
        return arena

    async def _open(self) -> None:
        await anyio.to_thread.run_sync(self._map)
        self._released = anyio.Event()
        self._loop_thread = threading.get_ident()
        self._loop = asyncio.get_running_loop()

    def _map(self) -> None:
        config = self.config
        length = self._data_offset + self.n_pages * config.page_bytes
        fd = os.memfd_create("miles_lite_arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, length)
            mapping = map_shared(fd, length, self._data_offset, config.prefault_bytes)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._mmap = mapping
        self._view = memoryview(mapping)
        self._table = PageTable(fd, self._view[: self.n_pages], config.page_bytes)
        self._data = np.frombuffer(mapping, dtype=np.uint8, offset=self._data_offset)

    def statistics(self) -> ArenaStatistics:
        """A snapshot of the arena's use."""
        return ArenaStatistics(
            used_bytes=self.used_bytes, size_bytes=self.config.size_bytes, waits=self.waits
        )

    @property
    def handle(self) -> ArenaHandle:
        """What workers need to attach (see :class:`WorkerArena`)."""
        self._check_open()
        return ArenaHandle(
            pid=os.getpid(),
            fd=self._fd,
            page_bytes=self.config.page_bytes,
            n_pages=self.n_pages,
            data_offset=self._data_offset,
            prefault_bytes=self.config.prefault_bytes,
        )

    @property
    def used_bytes(self) -> int:
        """Bytes allocated now (main process and workers)."""
        self._drain()
        return self._table.used_pages() * self.config.page_bytes

    def try_lease(self, nbytes: int) -> Lease | None:
        """Allocate ``nbytes`` now if they fit, else None."""
        self._check_open()
        n_pages = self._table.pages_for(nbytes)
        if n_pages > self.n_pages:
            raise ArenaFullError(
                f"allocation of {nbytes} bytes exceeds the arena of {self.config.size_bytes} "
                "bytes; raise ArenaConfig.size_bytes"
            )
        self._drain()
        allocation = self._table.try_alloc(n_pages, PARENT)
        if allocation is None:
            return None
        return self._lease(allocation, nbytes)

    async def lease(self, nbytes: int) -> Lease:
        """Allocate ``nbytes``, waiting for released space (backpressure).

        Raises :class:`ArenaFullError` when the request can never fit (at once) or no
        space is freed within ``wait_s``. Cancellation while waiting allocates nothing.
        """
        lease = self.try_lease(nbytes)
        if lease is not None:
            return lease
        self.waits += 1
        with anyio.move_on_after(self.config.wait_s):
            while True:
                # Frees come from garbage collection (any thread) and from worker
                # shrinks, so poll as well as wait for the event.
                with anyio.move_on_after(0.005):
                    await self._released.wait()
                self._released = anyio.Event()
                lease = self.try_lease(nbytes)
                if lease is not None:
                    return lease
        raise ArenaFullError(
            f"no {nbytes} bytes free in the arena within {self.config.wait_s} s "
            f"({self.used_bytes} of {self.config.size_bytes} bytes held): release tensors "
            "(Sample.detach_tensors or drop references) or raise ArenaConfig.size_bytes"
        )

    def adopt(self, allocation: Allocation, used_bytes: int) -> Lease:
        """Take over a worker's allocation, freeing its pages past ``used_bytes``."""
        self._check_open()
        keep = min(allocation.n_pages, self._table.pages_for(used_bytes))
        if keep < allocation.n_pages:
            self._table.free(allocation.first_page + keep, allocation.n_pages - keep)
            self._signal()
        self._table.retag(allocation.first_page, keep, PARENT)
        return self._lease(
            Allocation(allocation.first_page, keep, allocation.page_bytes), used_bytes
        )

    def tensor_ref(self, tensor: Any) -> ArenaTensor | None:
        """Where ``tensor`` lies in the arena, or None (not in it, or not contiguous).

        Lets another attached process read the tensor without its bytes being copied; the
        caller keeps ``tensor`` alive until the reader is done.
        """
        if self.closed or not tensor.is_contiguous() or tensor.device.type != "cpu":
            return None
        base = self._data.ctypes.data
        offset = tensor.data_ptr() - base
        nbytes = tensor.numel() * tensor.element_size()
        if offset < 0 or offset + nbytes > len(self._data):
            return None
        return ArenaTensor(offset, nbytes, str(tensor.dtype), tuple(tensor.shape))

    def discard(self, allocation: Allocation) -> None:
        """Free an allocation nobody will use (a worker result that arrived too late)."""
        if not self.closed:
            self._table.free(allocation.first_page, allocation.n_pages)
            self._signal()

    def shrink(self, lease: Lease, used_bytes: int) -> Lease:
        """A lease of the first ``used_bytes`` of ``lease``; the rest is freed now."""
        alloc = lease.allocation
        keep = self._table.pages_for(used_bytes)
        if keep >= alloc.n_pages:
            return lease
        lease._finalizer.detach()
        self._table.free(alloc.first_page + keep, alloc.n_pages - keep)
        self._signal()
        return self._lease(Allocation(alloc.first_page, keep, alloc.page_bytes), used_bytes)

    def reclaim(self, tag: int) -> int:
        """Free the pages a dead worker ``tag`` held; return the number of pages."""
        if self.closed:
            return 0
        freed = self._table.reclaim(tag)
        if freed:
            self._signal()
        return freed

    async def _close(self) -> None:
        """Stop serving allocations; memory still viewed by tensors lives on with them.

        Unmapping costs the kernel about 0.2 s of CPU a populated GiB, so it runs in a
        worker thread, never on the loop."""
        if not hasattr(self, "_mmap"):
            return  # never mapped
        self._data = None  # type: ignore[assignment]
        with anyio.CancelScope(shield=True):  # released even when cancelled
            await anyio.to_thread.run_sync(self._unmap)

    def _unmap(self) -> None:
        # The frees queued before the close, then every free page taken for good: a closed
        # arena serves no allocation, in this process or a worker.
        for first, n_pages in self._take_frees():
            self._table.free(first, n_pages)
        free_runs = self._table.retire_free()
        self._table.release()
        self._view.release()
        os.close(self._fd)
        mapping, self._mmap = self._mmap, None  # type: ignore[assignment]
        try:
            mapping.close()
        except BufferError:
            # Tensors still view it: only they hold the mapping now, and it is unmapped
            # when the last of them is collected, wherever that happens (on a loop, say).
            # The pages nobody holds go back to the kernel now, so that unmap costs only
            # the pages those tensors view.
            page = self.config.page_bytes
            for first, n_pages in free_runs:
                mapping.madvise(mmap.MADV_REMOVE, self._data_offset + first * page, n_pages * page)

    def _lease(self, allocation: Allocation, nbytes: int) -> Lease:
        array = self._data[allocation.offset : allocation.offset + nbytes]
        finalizer = weakref.finalize(
            array, _free_pages, self, allocation.first_page, allocation.n_pages
        )
        return Lease(array, allocation, finalizer)

    def _queue_free(self, first: int, n_pages: int) -> None:
        # Runs in a finalizer: any thread, any moment, maybe inside try_alloc holding the
        # page table's (non-reentrant) lock. deque.append takes no lock we could hold, and
        # neither does call_soon_threadsafe (a deque append and a byte to the self-pipe).
        self._pending_frees.append((first, n_pages))
        loop = self._loop
        if loop is None or self._drain_scheduled or self.closed:
            return
        # Cleared by the drain before it reads the queue: a free queued after that
        # schedules another drain, one queued before it is drained by this one.
        self._drain_scheduled = True
        try:
            loop.call_soon_threadsafe(self._scheduled_drain)
        except RuntimeError:  # the loop is closed: the next allocation drains
            self._drain_scheduled = False

    def _scheduled_drain(self) -> None:
        self._drain_scheduled = False
        self._drain()

    def _drain(self) -> None:
        if not self._pending_frees:
            return  # the usual case, on every allocation
        frees = self._take_frees()
        if not frees or self.closed:
            return
        for first, n_pages in frees:
            self._table.free(first, n_pages)
        self._signal()

    def _take_frees(self) -> list[tuple[int, int]]:
        # Each pop is atomic, and the close's thread may take frees as a drain does.
        taken: list[tuple[int, int]] = []
        with contextlib.suppress(IndexError):
            while True:
                taken.append(self._pending_frees.popleft())
        return taken

    def _signal(self) -> None:
        # Event.set is only safe on the loop's thread; a free from another thread (garbage
        # collection there, a late worker result) is picked up by the polling in lease().
        if threading.get_ident() == self._loop_thread:
            self._released.set()


def _free_pages(arena: Arena, first: int, n_pages: int) -> None:
    arena._queue_free(first, n_pages)
