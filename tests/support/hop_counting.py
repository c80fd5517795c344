"""A text context that counts its worker-thread calls: what a test of "at most one thread
hop a turn" counts (never times)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from miles_lite.text.context import TextContext

__all__ = ["HopCountingContext"]

T = TypeVar("T")


@dataclass
class HopCountingContext(TextContext):
    """A :class:`TextContext` whose ``hops`` counts its :meth:`off_loop` calls."""

    hops: int = 0

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        self.hops += 1
        return await super().off_loop(fn, *args)
