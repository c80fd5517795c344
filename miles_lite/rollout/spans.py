"""Stage times of every unit of work (a diffusion microgroup, a text sample), the run's own
times, and their metrics."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any

__all__ = ["RunTimes", "UnitSpan", "span_metrics"]


@dataclass(frozen=True, slots=True)
class RunTimes:
    """When one ``run()`` started and ended, and its early stop (abort at the engines and
    drain) if it had one: ``time.monotonic()`` seconds, as the spans."""

    start: float
    end: float
    stop_start: float | None = None
    stop_end: float | None = None


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
    arena path). ``leased_at``: when its (first) request got an engine slot, so
    ``generate_start`` to ``leased_at`` is time spent waiting for one. ``parser_worker`` /
    ``reward_worker``: the pool workers that decoded and scored it (``reward_pool`` names
    the reward kind; ``fetched_in_parser``: the parser worker also posted the request and
    waited for the answer); ``aborted``: it came back ABORTED (early stop).
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
    leased_at: float | None = None
    parser_worker: int | None = None
    fetched_in_parser: bool = False
    reward_pool: str | None = None
    reward_worker: int | None = None
    aborted: bool = False

    def leased(self) -> None:
        """Its request got an engine slot now (the first one counts)."""
        if self.leased_at is None:
            self.leased_at = time.monotonic()

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for loggers)."""
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


#: Each stage's (start, end) of a span, read at C speed (the metrics read every unit's).
_STAGE_TIMES = tuple(
    (stage, attrgetter(f"{stage}_start", f"{stage}_end"))
    for stage in ("generate", "deserialize", "reward")
)
_COUNTERS = attrgetter("wire_bytes", "spilled", "pickled_bytes")


def span_metrics(spans: list[UnitSpan]) -> dict[str, float]:
    """Mean and max stage durations (seconds), wire bytes and arena spills over units."""
    out: dict[str, float] = {}
    for stage, times in _STAGE_TIMES:
        durations = [
            end - start for start, end in map(times, spans) if start is not None and end is not None
        ]
        out[f"perf/{stage}_time_mean"] = _mean(durations)
        out[f"perf/{stage}_time_max"] = max(durations, default=0.0)
    wire = spilled = pickled = 0
    for wire_bytes, spill, pickled_bytes in map(_COUNTERS, spans):
        wire += wire_bytes
        spilled += spill
        pickled += pickled_bytes
    out["perf/wire_bytes"] = float(wire)
    out["perf/arena_spills"] = float(spilled)
    out["perf/pickled_bytes"] = float(pickled)
    return out
