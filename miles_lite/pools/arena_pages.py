"""The arena's shared parts: its page table, the handle workers attach with, allocations.

The page table has one byte per data page: 0 free, 1 owned by the main process, 2..255
owned by the worker with that tag (allocated by it, not yet handed over). It is changed
only under ``flock`` on the memfd, which the kernel releases if a holder dies, so workers
allocate for themselves and the main process frees.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import re
import threading
from dataclasses import dataclass

__all__ = [
    "FIRST_WORKER_TAG",
    "FREE",
    "LAST_WORKER_TAG",
    "PARENT",
    "Allocation",
    "ArenaHandle",
    "ArenaTensor",
    "PageTable",
    "map_shared",
]

FREE = 0
PARENT = 1
FIRST_WORKER_TAG = 2
LAST_WORKER_TAG = 255


@dataclass(frozen=True, slots=True)
class ArenaHandle:
    """What a worker needs to attach to an arena (small, picklable)."""

    pid: int
    fd: int
    page_bytes: int
    n_pages: int
    data_offset: int
    #: Bytes of the data area the worker pre-faults when it attaches.
    prefault_bytes: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """``n_pages`` pages from ``first_page``; ``offset`` is the byte offset in the data area."""

    first_page: int
    n_pages: int
    page_bytes: int

    @property
    def offset(self) -> int:
        return self.first_page * self.page_bytes

    @property
    def nbytes(self) -> int:
        return self.n_pages * self.page_bytes


@dataclass(frozen=True, slots=True)
class ArenaTensor:
    """A contiguous tensor that lies in the arena, named by place: ``nbytes`` at ``offset``
    of the data area. Pickles in bytes, whatever the tensor's size."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


class PageTable:
    """The page table, shared by all processes; every change is made under flock."""

    def __init__(self, fd: int, table: memoryview, page_bytes: int) -> None:
        self._fd = fd
        self._table = table
        self._page_bytes = page_bytes
        # flock excludes other processes, not other threads of this one.
        self._thread_lock = threading.Lock()

    def __enter__(self) -> None:
        """Hold the table against this process's other threads and every other process."""
        self._thread_lock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def pages_for(self, nbytes: int) -> int:
        return max(1, math.ceil(nbytes / self._page_bytes))

    def try_alloc(self, n_pages: int, tag: int) -> Allocation | None:
        with self:
            first = bytes(self._table).find(bytes(n_pages))
            if first < 0:
                return None
            self._table[first : first + n_pages] = bytes([tag]) * n_pages
        return Allocation(first, n_pages, self._page_bytes)

    def retag(self, first: int, n_pages: int, tag: int) -> None:
        with self:
            self._table[first : first + n_pages] = bytes([tag]) * n_pages

    def free(self, first: int, n_pages: int) -> None:
        self.retag(first, n_pages, FREE)

    def reclaim(self, tag: int) -> int:
        """Free every page owned by ``tag`` (a dead worker); return how many."""
        with self:
            snapshot = bytes(self._table)
            freed = snapshot.count(tag)
            if freed:
                self._table[:] = snapshot.replace(bytes([tag]), bytes(1))
        return freed

    def retire_free(self) -> list[tuple[int, int]]:
        """Take every free page for good (tagged as the main process's) and return them
        as runs of (first page, pages): the arena is closing, and no allocation may take a
        page whose memory is being given back."""
        with self:
            snapshot = bytes(self._table)
            self._table[:] = snapshot.replace(bytes(1), bytes([PARENT]))
        return [(run.start(), run.end() - run.start()) for run in re.finditer(b"\x00+", snapshot)]

    def used_pages(self) -> int:
        return len(self._table) - bytes(self._table).count(0)

    def release(self) -> None:
        self._table.release()


# Linux 5.14+: fault pages in as if written, without changing them (Python 3.11's mmap
# module has no name for it).
_MADV_POPULATE_WRITE = 23
_READ_WRITE = mmap.PROT_READ | mmap.PROT_WRITE


def map_shared(fd: int, length: int, data_offset: int, prefault_bytes: int) -> mmap.mmap:
    """Map the arena's memfd (``length`` bytes) and fault in its page table and the first
    ``prefault_bytes`` of its data area: a page faulted later costs a trip into the kernel
    on the hot path, one faulted now costs memory whether it is used or not."""
    if prefault_bytes >= length - data_offset:
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=_READ_WRITE)
    mapping = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=_READ_WRITE)
    end = data_offset + prefault_bytes
    end += -end % mmap.PAGESIZE
    try:
        mapping.madvise(_MADV_POPULATE_WRITE, 0, end)
    except OSError:
        # An older kernel: read a byte of each page (reading never changes shared bytes
        # another process may own).
        view = memoryview(mapping)
        try:
            bytes(view[0 : end : mmap.PAGESIZE])
        finally:
            view.release()
    return mapping
