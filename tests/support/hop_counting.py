"""A text context whose tokenizer threads count their calls: what a test of "at most one
thread hop a turn" counts (never times)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from miles_lite.text.context import TextContext, TokenizerThreads

__all__ = ["HopCountingContext", "HopCountingThreads"]

T = TypeVar("T")


@dataclass
class HopCountingThreads(TokenizerThreads):
    """:class:`TokenizerThreads` whose ``hops`` counts its :meth:`off_loop` calls."""

    hops: int = 0

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        self.hops += 1
        return await super().off_loop(fn, *args)


@dataclass
class HopCountingContext(TextContext):
    """A :class:`TextContext` whose :attr:`threads` count their calls (:attr:`hops`)."""

    @property
    def threads(self) -> HopCountingThreads:
        if not isinstance(self._threads, HopCountingThreads):
            self._threads = HopCountingThreads(self.tokenizer, self.tokenize_threads)
        return self._threads

    @property
    def hops(self) -> int:
        """Worker-thread calls so far."""
        return self.threads.hops
