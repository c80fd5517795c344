"""What belongs to one ``run()``: its rollout id, its stop signal, its requests in flight.

Made by the driver for each run and handed to the kind, the generate functions and the
session server, so two runs on one rollout never share a stop flag or abort each other's
requests.
"""

from __future__ import annotations

import anyio

__all__ = ["InFlight", "RunContext"]


class InFlight:
    """The rids of one run's requests out to an engine: each with the engine it went to
    (``None`` while it waits for a slot), so an abort reaches the engine that holds it."""

    def __init__(self) -> None:
        self._at: dict[str, str | None] = {}

    def track(self, rid: str) -> _Tracked:
        """Count ``rid`` in flight for the duration of the ``with`` block."""
        return _Tracked(self._at, rid)

    def add(self, rid: str) -> None:
        """Count ``rid`` in flight until :meth:`discard` (what :meth:`track` does, without
        a context manager object alive for the whole request: the send path's own)."""
        self._at[rid] = None

    def discard(self, rid: str) -> None:
        """``rid`` is no longer in flight."""
        self._at.pop(rid, None)

    def sent_to(self, rid: str, url: str) -> None:
        """``rid`` is being sent to the engine at ``url`` (a lease was taken)."""
        if rid in self._at:
            self._at[rid] = url

    def by_engine(self) -> dict[str, list[str]]:
        """The rids sent to each engine, oldest first (rids still waiting left out)."""
        out: dict[str, list[str]] = {}
        for rid, url in self._at.items():
            if url is not None:
                out.setdefault(url, []).append(rid)
        return out

    def rids(self) -> list[str]:
        """A snapshot of the rids in flight, oldest first."""
        return list(self._at)

    def __len__(self) -> int:
        return len(self._at)


class _Tracked:
    """The ``with`` block of :meth:`InFlight.track` (a class, not a generator: one per
    request, on the hot path)."""

    __slots__ = ("_at", "_rid")

    def __init__(self, at: dict[str, str | None], rid: str) -> None:
        self._at, self._rid = at, rid

    def __enter__(self) -> None:
        self._at[self._rid] = None

    def __exit__(self, *exc: object) -> None:
        self._at.pop(self._rid, None)


class RunContext:
    """One run of a rollout: ``rollout_id``, the ``stop`` event (set on early stop or
    cancellation: send nothing new), the requests ``in_flight``.

    Made inside the running event loop (it holds an ``anyio.Event``).
    """

    __slots__ = ("__weakref__", "in_flight", "rollout_id", "stop")

    def __init__(self, rollout_id: int) -> None:
        self.rollout_id = rollout_id
        self.stop = anyio.Event()
        self.in_flight = InFlight()

    @property
    def stopping(self) -> bool:
        """Whether the run stopped early: generate functions send nothing new."""
        return self.stop.is_set()
