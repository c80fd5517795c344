"""Faults of the shared-memory arena: finalizers and per-sample lifetimes."""

from __future__ import annotations

import gc
import threading

import pytest

from miles_lite.pools.arena import Arena, ArenaConfig

pytestmark = pytest.mark.anyio

PAGE = 4096


def _drop_under_the_lock(arena: Arena, holder: list[object], done: threading.Event) -> None:
    # What a collection inside try_alloc does: the last reference to a lease goes while
    # this thread holds the page table's lock.
    with arena._table._thread_lock:
        holder.clear()
        gc.collect()
    done.set()


async def test_a_lease_collected_while_the_page_table_lock_is_held_does_not_deadlock() -> None:
    async with Arena(ArenaConfig(size_bytes=16 * PAGE, page_bytes=PAGE, populate=False)) as arena:
        holder: list[object] = [arena.try_lease(3 * PAGE)]
        assert arena.used_bytes == 3 * PAGE
        done = threading.Event()
        thread = threading.Thread(
            target=_drop_under_the_lock, args=(arena, holder, done), daemon=True
        )
        thread.start()
        thread.join(5)  # bounded: a deadlock would otherwise hang here for good
        assert done.is_set(), "the finalizer deadlocked on the page table's lock"
        assert arena.used_bytes == 0
        assert arena.try_lease(16 * PAGE) is not None
