"""What a kind of rollout gives the driver (:class:`RolloutKind`): its units of work, the
generate call, the abort at the engines on early stop, and its metrics of a run."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from miles_lite.rollout.context import RunContext
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample

__all__ = ["KindMetrics", "RolloutKind"]


#: Given the kept samples and the rollout time (seconds), a kind's metrics of one run.
KindMetrics = Callable[[list[Sample], float], dict[str, float]]


class RolloutKind(Protocol):
    """What a kind of rollout gives the driver."""

    #: After ``abort``, wait (bounded) for in-flight units to come back with partial
    #: output (text) instead of cancelling them at once (diffusion: engines cannot abort).
    drain_on_stop: bool

    def units(self, group: list[Sample]) -> list[list[Sample]]:
        """Cut a group into units of work (each sent by one generate call)."""
        ...

    async def generate(self, unit: list[Sample], span: UnitSpan, run: RunContext) -> list[Sample]:
        """Generate one unit in ``run``; return its samples (may be more than given). May
        raise."""
        ...

    async def abort(self, run: RunContext, *, alone: bool) -> dict[str, float]:
        """Stop ``run``'s in-flight work at the engines (early stop; ``alone``: no other
        run is in flight on this driver); return metrics of the abort. Bounded by the
        driver."""
        ...

    def measure(self) -> AbstractContextManager[KindMetrics]:
        """A window over one run (its pools' statistics); yields the function giving the
        kind's metrics of the run."""
        ...
