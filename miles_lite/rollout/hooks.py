"""How a consumer of kept groups takes part in a driver's run (the trainer's side of
:mod:`miles_lite.training.stream`): :class:`RunHooks` it implements, :class:`RunHandle`
the run gives it.

The driver calls the hooks from the event loop and never awaits them: ``admits`` before
each group start (backpressure), ``started`` and ``finished`` as groups start and end,
``holding`` before the run ends (a kept group may still be refused). Through the handle,
the consumer wakes the scheduler (a place freed), refuses a kept group (dropped, or
replaced and started again) or stops the run early; the run applies these in its own
scheduling task, in the order they came.
"""

from __future__ import annotations

from typing import Protocol

from miles_lite.types import Sample

__all__ = ["RunHandle", "RunHooks"]


class RunHandle(Protocol):
    """What a run offers its :class:`RunHooks` (calls from the event loop, never blocking)."""

    def wake(self) -> None:
        """Let the scheduler look again (a group was taken: one more may start)."""
        ...

    def stop(self) -> None:
        """Stop the run early, as when enough groups are kept: in-flight work is aborted,
        unfinished groups come back as partial."""
        ...

    def refuse(self, index: int, restart: list[Sample] | None, reason: str) -> bool:
        """Take back kept group ``index``: dropped with ``reason`` (``restart`` None), or
        replaced by ``restart`` and started again. False once the run is over (nothing
        changed)."""
        ...


class RunHooks(Protocol):
    """A consumer of one run's kept groups (see the module docstring)."""

    def attach(self, handle: RunHandle) -> None:
        """Called once, before any group starts."""
        ...

    def admits(self) -> bool:
        """Whether one more group may start now (checked before each start)."""
        ...

    def started(self, index: int) -> None:
        """Group ``index`` started (again, for a restarted one)."""
        ...

    def finished(self, index: int, group: list[Sample], kept: bool) -> None:
        """Group ``index`` ended, kept (enough not yet kept) or dropped by a filter."""
        ...

    def holding(self) -> bool:
        """Whether the run must wait: kept groups may still be refused."""
        ...
