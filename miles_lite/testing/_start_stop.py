"""Sync and async context management over blocking ``start()``/``stop()`` (stand-in engine
processes, the real SGLang server)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["StartStop"]


class StartStop:
    """Sync and async context management over blocking ``start()``/``stop()``.

    Both forms stop what a failed start left; the async form runs them in a worker thread
    and stops even when cancelled in start.
    """

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        try:
            await anyio.to_thread.run_sync(self.start)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.stop)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)
