"""Fault switches of the stand-in engine, settable from tests or over HTTP."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["Faults"]

_COUNTERS = ("drop_connection_next", "truncate_body_next", "stall_next", "corrupt_body_next")


@dataclass
class Faults:
    """What the next ``/rollout/generate`` requests suffer; mutable at any time.

    Usage: ``engine.faults.status_next = [503, 503]`` (or ``POST /_stand_in/faults`` with
    ``{"status_next": [503, 503]}``). Each ``*_next`` counter is decremented by the request
    it hits. Applied in this order, at most one of the last four per request:

    1. ``stall_next``: wait ``stall_s`` seconds before doing anything (default one hour: a
       hang; a client timeout or ``aclose()`` ends it); then the request goes on.
    2. ``drop_connection_next``: close the socket without answering.
    3. ``status_next``: answer the first status of the list (popped) with
       ``{"detail": "stand-in fault: status N"}``, without generating.
    4. ``corrupt_body_next``: answer 200 with the right Content-Type and garbage bytes
       (not valid msgpack or JSON), without generating.
    5. ``truncate_body_next``: generate, announce the full Content-Length, send half the
       body, close the socket.

    ``unhealthy=True`` makes ``/health`` and ``/health_generate`` answer 503 until reset.
    """

    drop_connection_next: int = 0
    truncate_body_next: int = 0
    stall_next: int = 0
    stall_s: float = 3600.0
    status_next: list[int] = field(default_factory=list)
    corrupt_body_next: int = 0
    unhealthy: bool = False

    def update(self, changes: Mapping[str, Any]) -> None:
        """Set the named switches (the JSON of ``POST /_stand_in/faults``).

        All or nothing: raises :class:`ValueError` naming the first
        unknown switch or bad value, and then changes nothing.
        """
        known = {f.name for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault switch {name!r}; known: {sorted(known)}")
            _check(name, value)
        for name, value in changes.items():
            setattr(self, name, list(value) if name == "status_next" else value)

    def clear(self) -> None:
        """Turn every fault off."""
        self.update(asdict(Faults()))

    def to_json(self) -> dict[str, Any]:
        """The switches as a JSON-ready map."""
        return asdict(self)


def _check(name: str, value: Any) -> None:
    if name in _COUNTERS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"fault {name} must be an int >= 0, got {value!r}")
    elif name == "stall_s":
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(
                f"fault stall_s must be a finite number of seconds >= 0, got {value!r}"
            )
    elif name == "status_next":
        if not isinstance(value, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in value
        ):
            raise ValueError(f"fault status_next must be a list of HTTP statuses, got {value!r}")
    elif name == "unhealthy" and not isinstance(value, bool):
        raise ValueError(f"fault unhealthy must be a bool, got {value!r}")
