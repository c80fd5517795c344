"""Stage times of every unit of work (a diffusion microgroup, a text sample) and their metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["UnitSpan", "span_metrics"]


@dataclass
class UnitSpan:
    """When each stage of one unit of work started and ended (``time.monotonic()`` seconds).

    A unit is a diffusion microgroup or one text sample. The driver fills the indices and
    the reward stage; the generate function fills the rest through ``input.span``.
    ``engine`` is the URL that generated it (the last one, for several requests),
    ``requests`` the number of engine requests it made, ``wire_bytes`` its body bytes,
    ``non_generation_time_s`` time spent outside the engine (tools, environments),
    ``error`` the message of the error that failed it (None if it succeeded). A stage that
    did not run has ``None`` times. ``spilled``: the arena was full, the body took private
    memory. ``pickled_bytes``: body or tensor bytes that crossed a worker's pipe (0 on the
    arena path).
    """

    group_index: int
    unit_index: int
    size: int
    engine: str | None = None
    requests: int = 0
    generate_start: float | None = None
    generate_end: float | None = None
    deserialize_start: float | None = None
    deserialize_end: float | None = None
    reward_start: float | None = None
    reward_end: float | None = None
    wire_bytes: int = 0
    non_generation_time_s: float = 0.0
    spilled: bool = False
    pickled_bytes: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for loggers)."""
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def span_metrics(spans: list[UnitSpan]) -> dict[str, float]:
    """Mean and max stage durations (seconds), wire bytes and arena spills over units."""
    out: dict[str, float] = {}
    for stage in ("generate", "deserialize", "reward"):
        durations = [
            getattr(s, f"{stage}_end") - getattr(s, f"{stage}_start")
            for s in spans
            if getattr(s, f"{stage}_start") is not None and getattr(s, f"{stage}_end") is not None
        ]
        out[f"perf/{stage}_time_mean"] = _mean(durations)
        out[f"perf/{stage}_time_max"] = max(durations, default=0.0)
    out["perf/wire_bytes"] = float(sum(s.wire_bytes for s in spans))
    out["perf/arena_spills"] = float(sum(s.spilled for s in spans))
    out["perf/pickled_bytes"] = float(sum(s.pickled_bytes for s in spans))
    return out
