"""One lifecycle for every resource owner: new -> open -> closed.

Pools, clients, routers, servers and arenas subclass :class:`AsyncResource`: ``async
with`` opens them (once), :meth:`~AsyncResource.aclose` closes them (idempotent, shielded
from cancellation), and any use outside the open state raises one
:class:`~miles_lite.errors.ClosedResourceError`, which is also anyio's.
"""

from __future__ import annotations

import enum
from types import TracebackType
from typing import TypeVar

import anyio.abc

from miles_lite.errors import ClosedResourceError

__all__ = ["AsyncResource", "ResourceState"]

R = TypeVar("R", bound="AsyncResource")


class ResourceState(enum.Enum):
    """Where a resource stands: made (``NEW``), in use (``OPEN``), or done (``CLOSED``)."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class AsyncResource(anyio.abc.AsyncResource):
    """A resource with one state machine (``new -> open -> closed``).

    Subclasses implement :meth:`_open` (called by ``__aenter__``) and :meth:`_close`
    (called once by :meth:`aclose`; it shields and bounds what it awaits, so that a
    close in a cancelled scope completes), and call :meth:`_check_open` before any use. ``_resource_name`` names the resource in
    messages. A failed ``_open`` closes what it opened and leaves the resource closed.
    """

    _resource_name = "resource"

    def __init__(self) -> None:
        self._state = ResourceState.NEW

    @property
    def state(self) -> ResourceState:
        """Where the resource stands."""
        return self._state

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._state is ResourceState.CLOSED

    async def __aenter__(self: R) -> R:
        if self._state is not ResourceState.NEW:
            raise ClosedResourceError(
                f"{self._describe()} was already {'opened' if self._state is ResourceState.OPEN else 'closed'};"
                " make a new one"
            )
        self._state = ResourceState.OPEN
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the resource. Idempotent; completes in a cancelled scope too (what it
        waits for is shielded and bounded)."""
        if self._state is ResourceState.CLOSED:
            return
        self._state = ResourceState.CLOSED
        await self._close()

    def _check_open(self, *, url: str | None = None, request_id: str | None = None) -> None:
        """Raise :class:`ClosedResourceError` unless the resource is open."""
        if self._state is ResourceState.OPEN:
            return
        if self._state is ResourceState.NEW:
            message = f"{self._describe()} is not open: use it inside `async with` first"
        else:
            message = f"{self._describe()} is closed (aclose() was called): make a new one"
        raise ClosedResourceError(message, url=url, request_id=request_id)

    def _describe(self) -> str:
        return self._resource_name

    async def _open(self) -> None:
        """Acquire what the resource holds (sockets, workers, tasks). Default: nothing."""

    async def _close(self) -> None:
        """Release what :meth:`_open` acquired (shielded, bounded). Default: nothing."""
