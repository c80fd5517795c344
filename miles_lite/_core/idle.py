"""Reused workers waiting for their next job: :class:`IdleWorkers`.

A worker that finished its job waits on a bare future (the leanest wait there is: an anyio
or asyncio ``Event`` is a future plus a deque and a lock) instead of ending, and the next
job is handed to it rather than to a new task (an anyio task costs tens of microseconds of
CPU to start). The rollout's unit workers and the session workers' link answerers wait
this way.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

__all__ = ["IdleWorkers"]

JobT = TypeVar("JobT")


class IdleWorkers(Generic[JobT]):
    """Workers waiting for a job: :meth:`wait` gives a worker the future to await (its
    next job, or None: end), :meth:`hand` gives a job to one waiting worker,
    :meth:`release` ends every waiting worker."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: list[asyncio.Future[JobT | None]] = []

    def wait(self) -> asyncio.Future[JobT | None]:
        """The future a worker awaits for its next job (None: the worker ends)."""
        waiter: asyncio.Future[JobT | None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter

    def hand(self, job: JobT | None) -> bool:
        """Give ``job`` to a waiting worker (None: it ends); False when none waits."""
        while self._waiting:
            waiter = self._waiting.pop()
            if not waiter.done():  # else its worker was cancelled
                waiter.set_result(job)
                return True
        return False

    def release(self) -> None:
        """End every waiting worker (each gets None)."""
        while self.hand(None):
            pass
