"""A worker process's side of the arena: attach, allocate, write, hand over by page numbers."""

from __future__ import annotations

import os
import time
from typing import Any

from miles_lite.errors import ArenaError, ArenaFullError
from miles_lite.pools.arena_pages import (
    FIRST_WORKER_TAG,
    LAST_WORKER_TAG,
    Allocation,
    ArenaHandle,
    ArenaTensor,
    PageTable,
    map_shared,
)

__all__ = ["WorkerArena"]


class WorkerArena:
    """A worker process's side of an arena: allocate, write, hand over by page numbers."""

    def __init__(self, handle: ArenaHandle, tag: int | None) -> None:
        # tag None: a reader (reward workers), which never allocates.
        if tag is not None and not FIRST_WORKER_TAG <= tag <= LAST_WORKER_TAG:
            raise ArenaError(f"worker tag must be in [2, 255], got {tag}")
        self.tag = tag
        self.handle = handle
        self._fd = os.open(f"/proc/{handle.pid}/fd/{handle.fd}", os.O_RDWR | os.O_CLOEXEC)
        length = handle.data_offset + handle.n_pages * handle.page_bytes
        self._mmap = map_shared(self._fd, length, handle.data_offset, handle.prefault_bytes)
        view = memoryview(self._mmap)
        self._table = PageTable(self._fd, view[: handle.n_pages], handle.page_bytes)
        self._data = view[handle.data_offset :]

    def view(self, allocation: Allocation, nbytes: int | None = None) -> memoryview:
        """The writable bytes of ``allocation`` (its first ``nbytes``, by default all)."""
        n = allocation.nbytes if nbytes is None else nbytes
        return self._data[allocation.offset : allocation.offset + n]

    def alloc(self, nbytes: int, *, timeout_s: float) -> Allocation:
        """Allocate ``nbytes`` for this worker, waiting up to ``timeout_s`` for space."""
        if self.tag is None:
            raise ArenaError("this worker attached to the arena as a reader")
        n_pages = self._table.pages_for(nbytes)
        if n_pages > self.handle.n_pages:
            raise ArenaFullError(
                f"allocation of {nbytes} bytes exceeds the arena of "
                f"{self.handle.n_pages * self.handle.page_bytes} bytes; raise ArenaConfig.size_bytes"
            )
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while True:
            allocation = self._table.try_alloc(n_pages, self.tag)
            if allocation is not None:
                return allocation
            if time.monotonic() > deadline:
                raise ArenaFullError(f"no {nbytes} bytes free in the arena within {timeout_s} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def tensor(self, ref: ArenaTensor) -> Any:
        """A tensor viewing the bytes ``ref`` names (valid while the owner keeps them)."""
        from miles_lite.codecs.tensor_map import TensorRef
        from miles_lite.codecs.tensors import materialize

        return materialize(TensorRef(ref.offset, ref.nbytes, ref.dtype, ref.shape), self._data)

    def free(self, allocation: Allocation) -> None:
        """Give back an allocation this worker will not hand over (on error)."""
        self._table.free(allocation.first_page, allocation.n_pages)
