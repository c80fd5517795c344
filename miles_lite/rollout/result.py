"""What a rollout returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from miles_lite.rollout.spans import RunTimes, UnitSpan
from miles_lite.types import Sample, SampleStatus

__all__ = ["RolloutResult"]


@dataclass
class RolloutResult:
    """What a rollout returns.

    - ``groups``: the kept groups in prompt order, samples sorted by index (FAILED samples
      included, with their error);
    - ``filtered``: groups the dynamic filters dropped, and ``filter_reasons`` (same order);
    - ``partial``: groups the rollout started but did not finish because enough groups
      were kept (early stop), and groups it never needed to start: their samples are
      ABORTED with partial output, PENDING, or finished without a group verdict. Pass them
      to the next ``run()`` to resume them (partial rollout);
    - ``metrics``: flat floats (``perf/rollout_time``, ``rollout/...``, queue depths);
    - ``spans``: the stage times of every unit of work;
    - ``rollout_id``: the id the seeds were drawn from;
    - ``engines``: the rollout's engine URLs (a trace shows the idle ones too);
    - ``times``: when the run started and ended, and its early stop
      (``time.monotonic()`` seconds, as the spans).

    :func:`~miles_lite.rollout.trace.write_trace` and
    :func:`~miles_lite.rollout.trace.write_timeline_png` draw it.
    """

    groups: list[list[Sample]]
    filtered: list[list[Sample]] = field(default_factory=list)
    filter_reasons: list[str] = field(default_factory=list)
    partial: list[list[Sample]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    spans: list[UnitSpan] = field(default_factory=list)
    rollout_id: int = 0
    engines: tuple[str, ...] = ()
    times: RunTimes = field(default_factory=lambda: RunTimes(start=0.0, end=0.0))

    @property
    def samples(self) -> list[Sample]:
        """Every sample of the kept groups, sorted by index."""
        return sorted((s for g in self.groups for s in g), key=lambda s: s.index)

    @property
    def failed(self) -> list[Sample]:
        """The kept samples that failed, with ``sample.error`` saying why."""
        return [s for s in self.samples if s.status is SampleStatus.FAILED]
