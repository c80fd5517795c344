"""What a rollout returns."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

from miles_lite.errors import RolloutWarning
from miles_lite.rollout.spans import RunTimes, UnitSpan
from miles_lite.types import Sample, SampleStatus

__all__ = ["RolloutResult", "warn_if_none_kept"]


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
      (``time.monotonic()`` seconds, as the spans);
    - ``target``: the groups the run was asked to keep (``rollout_batch_size``);
      ``None``: every prompt.

    :meth:`summary` says it all in one line of words.

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
    target: int | None = None

    @property
    def samples(self) -> list[Sample]:
        """Every sample of the kept groups, sorted by index."""
        return sorted((s for g in self.groups for s in g), key=lambda s: s.index)

    @property
    def failed(self) -> list[Sample]:
        """The kept samples that failed, with ``sample.error`` saying why."""
        return [s for s in self.samples if s.status is SampleStatus.FAILED]

    @property
    def asked(self) -> int:
        """The groups the run was asked to keep: ``target``, else every prompt (kept,
        filtered and partial groups together)."""
        if self.target is not None:
            return self.target
        return len(self.groups) + len(self.filtered) + len(self.partial)

    def summary(self) -> str:
        """The run in one line of words: groups kept of those asked for, filtered (by
        reason, most first), partial and failed (kept groups holding a FAILED sample),
        then the kept samples, their response tokens and the run's seconds.

        Usage: ``print(result.summary())`` prints, e.g., ``rollout 0: kept 0 of 2 groups;
        filtered 2 (drop_zero_std_1.0: 2); partial 0; failed 0; 0 samples, 0 tokens,
        0.41 s``.
        """
        reasons = Counter(self.filter_reasons)
        filtered = f"filtered {len(self.filtered)}"
        if reasons:
            counted = ", ".join(f"{reason}: {n}" for reason, n in reasons.most_common())
            filtered += f" ({counted})"
        samples = self.samples
        failed_samples = sum(s.status is SampleStatus.FAILED for s in samples)
        failed_groups = sum(any(s.status is SampleStatus.FAILED for s in g) for g in self.groups)
        failed = f"failed {failed_groups}"
        if failed_groups:
            failed += f" ({failed_samples} {_plural(failed_samples, 'sample')})"
        tokens = sum(s.response_length for s in samples)
        seconds = self.metrics.get("perf/rollout_time", self.times.end - self.times.start)
        return (
            f"rollout {self.rollout_id}: kept {len(self.groups)} of {self.asked}"
            f" {_plural(self.asked, 'group')}; {filtered}; partial {len(self.partial)}; {failed};"
            f" {len(samples)} {_plural(len(samples), 'sample')},"
            f" {tokens} {_plural(tokens, 'token')}, {seconds:.2f} s"
        )


def _plural(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def warn_if_none_kept(result: RolloutResult, *, stacklevel: int = 1) -> bool:
    """Warn a :class:`~miles_lite.errors.RolloutWarning` when ``result`` keeps no group
    although it was asked for some (a run of no prompts asks for none), its message
    :meth:`RolloutResult.summary` and what to look at; whether it warned. ``stacklevel``:
    1 names the caller of this function, 2 its caller, as :func:`warnings.warn` counts."""
    if result.groups or result.asked == 0:
        return False
    reasons = set(result.filter_reasons)
    zero_std = {r for r in reasons if r.startswith("drop_zero_std")}
    hints = []
    if zero_std:
        hints.append(
            "drop_zero_std drops a group whose samples all got the same reward (a prompt"
            " the model always gets right, or always wrong): try other prompts, more"
            " samples per prompt, or no filter"
        )
    if reasons - zero_std:
        hints.append("see result.filtered and result.filter_reasons")
    if result.partial:
        hints.append("result.partial holds the groups left unfinished, to resume")
    advice = "; ".join(hints) or "see result.filtered and result.partial"
    warnings.warn(
        f"{result.summary()}: no group to train on ({advice})",
        RolloutWarning,
        stacklevel=stacklevel + 1,
    )
    return True
