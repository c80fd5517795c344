"""The results of recent calls by key, one call in flight per key: :class:`SharedCalls`.

The samples of a text group (``n_samples_per_prompt`` of one prompt) all need the same
prompt ids. They start together, so the first one's tokenizer call is shared by the
others while it runs, and its result is kept for the next while it is recent. A call that
fails (or is cancelled) is never shared: each caller waiting on it makes its own, so each
gets its own error, as if nothing were shared.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SharedCalls"]

T = TypeVar("T")


class SharedCalls(Generic[T]):
    """Results of ``make()`` by key (:meth:`get`), the ``size`` most recently used kept
    (``make()`` never returns None).

        ``copy`` makes what each caller gets from a result (its own list, say), so no caller
        changes what another gets. ``calls``: the ``make()`` calls run; ``shared``: the gets
        answered by another's call or a kept result (counters, not timings)."""

    __slots__ = ("_copy", "_entries", "_size", "calls", "shared")

    def __init__(self, copy: Callable[[T], T], size: int = 256) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._copy = copy
        self._size = size
        # A kept result, or the future of the call in flight (None: it failed).
        self._entries: OrderedDict[Hashable, _Kept[T] | asyncio.Future[T | None]] = OrderedDict()
        self.calls = 0
        self.shared = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        """``make()``'s result for ``key``: a kept one, the one of the call in flight for
        ``key`` (awaited), or a new call's; a copy either way."""
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            entries.move_to_end(key)
            if isinstance(entry, _Kept):
                self.shared += 1
                return self._copy(entry.value)
            if entry.get_loop() is asyncio.get_running_loop():
                # Shielded: a waiter that is cancelled leaves the call to its maker.
                value = await asyncio.shield(entry)
                if value is not None:
                    self.shared += 1
                    return self._copy(value)
                return await self._make(make)  # it failed: this caller's own call
        future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        entries[key] = future
        if len(entries) > self._size:
            entries.popitem(last=False)
        try:
            value = await self._make(make)
        except BaseException:
            if entries.get(key) is future:
                del entries[key]
            future.set_result(None)
            raise
        if entries.get(key) is future:
            entries[key] = _Kept(value)
        future.set_result(value)
        return self._copy(value)

    async def _make(self, make: Callable[[], Awaitable[T]]) -> T:
        self.calls += 1
        return await make()


class _Kept(Generic[T]):
    """A result kept (a class of its own: a result may itself be a future)."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value
