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

V = TypeVar("V")
R = TypeVar("R")


class SharedCalls(Generic[V, R]):
    """Results of ``make()`` by key (:meth:`get`; ``make()`` never returns None).

    A result is kept as ``make()`` returns it (compact, say: an array of ids) and each
    caller gets ``give(result)`` (its own list, say), so no caller changes what another
    gets. Kept: the ``size`` most recently used keys, and of their results at most
    ``budget`` in all as ``cost`` counts them (a result above it is shared with the
    callers waiting for it, and not kept). ``calls``: the ``make()`` calls run;
    ``shared``: the gets answered by another's call or a kept result (counters, not
    timings)."""

    __slots__ = ("_budget", "_cost", "_entries", "_give", "_kept", "_size", "calls", "shared")

    def __init__(
        self,
        give: Callable[[V], R],
        *,
        size: int = 256,
        cost: Callable[[V], int] | None = None,
        budget: int | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if (cost is None) != (budget is None):
            raise ValueError("cost and budget go together")
        self._give = give
        self._size = size
        self._cost = cost
        self._budget = budget
        self._kept = 0  # the kept results' cost
        # A kept result, or the future of the call in flight (None: it failed).
        self._entries: OrderedDict[Hashable, _Kept[V] | asyncio.Future[V | None]] = OrderedDict()
        self.calls = 0
        self.shared = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def kept_cost(self) -> int:
        """The cost of the results kept now."""
        return self._kept

    async def get(self, key: Hashable, make: Callable[[], Awaitable[V]]) -> R:
        """``give`` of ``make()``'s result for ``key``: a kept one, the one of the call in
        flight for ``key`` (awaited), or a new call's."""
        entries = self._entries
        entry = entries.get(key)
        if entry is not None:
            entries.move_to_end(key)
            if isinstance(entry, _Kept):
                self.shared += 1
                return self._give(entry.value)
            if entry.get_loop() is asyncio.get_running_loop():
                # Shielded: a waiter that is cancelled leaves the call to its maker.
                value = await asyncio.shield(entry)
                if value is not None:
                    self.shared += 1
                    return self._give(value)
                return self._give(await self._make(make))  # it failed: this caller's own
        future: asyncio.Future[V | None] = asyncio.get_running_loop().create_future()
        self._put(key, future)
        try:
            value = await self._make(make)
        except BaseException:
            if entries.get(key) is future:
                del entries[key]
            future.set_result(None)
            raise
        if entries.get(key) is future:
            del entries[key]
            cost = 0 if self._cost is None else self._cost(value)
            if self._budget is None or cost <= self._budget:
                self._put(key, _Kept(value, cost))
        future.set_result(value)
        return self._give(value)

    async def _make(self, make: Callable[[], Awaitable[V]]) -> V:
        self.calls += 1
        return await make()

    def _put(self, key: Hashable, entry: _Kept[V] | asyncio.Future[V | None]) -> None:
        """Add ``entry`` as the most recent; the least recent go while over a bound."""
        entries = self._entries
        entries[key] = entry
        if isinstance(entry, _Kept):
            self._kept += entry.cost
        while len(entries) > self._size or (self._budget is not None and self._kept > self._budget):
            _, gone = entries.popitem(last=False)
            if isinstance(gone, _Kept):
                self._kept -= gone.cost


class _Kept(Generic[V]):
    """A result kept, and its cost (a class of its own: a result may itself be a future)."""

    __slots__ = ("cost", "value")

    def __init__(self, value: V, cost: int) -> None:
        self.value = value
        self.cost = cost
