"""Per-microgroup stage times and the metrics computed from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["MicrogroupSpan", "span_metrics"]


@dataclass
class MicrogroupSpan:
    """When each stage of one microgroup started and ended (``time.monotonic()`` seconds).

    ``engine`` is the URL that generated it, ``wire_bytes`` its body size, ``error`` the
    message of the error that failed it (None if it succeeded). A stage that did not run
    has ``None`` times. ``spilled``: the arena was full, the body took private memory.
    """

    group_index: int
    microgroup_index: int
    size: int
    engine: str | None = None
    generate_start: float | None = None
    generate_end: float | None = None
    deserialize_start: float | None = None
    deserialize_end: float | None = None
    reward_start: float | None = None
    reward_end: float | None = None
    wire_bytes: int = 0
    spilled: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for loggers)."""
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def span_metrics(spans: list[MicrogroupSpan]) -> dict[str, float]:
    """Mean stage durations (seconds) and bytes over microgroups."""
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
    return out
