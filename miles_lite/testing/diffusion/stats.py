"""What a diffusion stand-in engine has seen and done: counters and a log of request bodies.

:class:`EngineStats` is live (the engine updates it as it runs; tests read and wait on
it); :class:`EngineStatistics` is a frozen snapshot of it
(:meth:`~miles_lite.testing.StandInEngine.statistics`), as every stand-in gives one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EngineStatistics", "EngineStats"]


@dataclass
class EngineStats:
    """Counters of one :class:`~miles_lite.testing.StandInEngine`, updated as it runs.

    ``requests_received`` counts every ``POST /rollout/generate``; each ends as exactly
    one of ``requests_served`` (a complete 200 answer with samples),
    ``requests_aborted`` (answered with an empty list after ``/abort_request``) or
    ``requests_failed`` (an error status, or a fault), unless the client went away first.
    ``generations_in_flight`` are generating now (at most ``max_concurrent``),
    ``requests_waiting`` wait for a slot; ``max_generations_in_flight`` is the most seen at
    once. ``samples_served`` and ``bytes_served`` (body bytes) count complete answers.
    ``requests`` holds the decoded JSON bodies received, oldest first (bounded by
    ``StandInConfig.request_log_limit``).
    """

    requests_received: int = 0
    requests_served: int = 0
    requests_aborted: int = 0
    requests_failed: int = 0
    samples_served: int = 0
    bytes_served: int = 0
    generations_in_flight: int = 0
    requests_waiting: int = 0
    max_generations_in_flight: int = 0
    requests: deque[Any] = field(default_factory=deque)

    def reset(self) -> None:
        """Zero the counters and empty the log; what is in flight now stays counted."""
        self.requests_received = self.requests_served = self.requests_aborted = 0
        self.requests_failed = self.samples_served = self.bytes_served = 0
        self.max_generations_in_flight = self.generations_in_flight
        self.requests.clear()

    def snapshot(self) -> EngineStatistics:
        """A frozen copy of the counters and the request log, as they are now."""
        return EngineStatistics(
            requests_received=self.requests_received,
            requests_served=self.requests_served,
            requests_aborted=self.requests_aborted,
            requests_failed=self.requests_failed,
            samples_served=self.samples_served,
            bytes_served=self.bytes_served,
            generations_in_flight=self.generations_in_flight,
            requests_waiting=self.requests_waiting,
            max_generations_in_flight=self.max_generations_in_flight,
            requests=tuple(self.requests),
        )

    def to_json(self) -> dict[str, Any]:
        """The counters and the request log as a JSON-ready map."""
        return {
            "requests_received": self.requests_received,
            "requests_served": self.requests_served,
            "requests_aborted": self.requests_aborted,
            "requests_failed": self.requests_failed,
            "samples_served": self.samples_served,
            "bytes_served": self.bytes_served,
            "generations_in_flight": self.generations_in_flight,
            "requests_waiting": self.requests_waiting,
            "max_generations_in_flight": self.max_generations_in_flight,
            "requests": list(self.requests),
        }


@dataclass(frozen=True, kw_only=True)
class EngineStatistics:
    """A snapshot of :class:`EngineStats` (:meth:`~miles_lite.testing.StandInEngine.statistics`):
    the same fields, ``requests`` a tuple."""

    requests_received: int
    requests_served: int
    requests_aborted: int
    requests_failed: int
    samples_served: int
    bytes_served: int
    generations_in_flight: int
    requests_waiting: int
    max_generations_in_flight: int
    requests: tuple[Any, ...]
