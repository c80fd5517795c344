"""How stale a group is, and what becomes of one too stale for the trainer.

A group's lag is how many weight updates its oldest token is behind the current version
(:class:`~miles_lite.engine.versions.WeightVersions`: the order in which the router
recorded them). With ``max_staleness`` (RolloutConfig), a group lagging more than that is
never handed to the trainer; by ``staleness_policy`` it is dropped, or its stale samples
are reset to their prompts and the group is generated again under the current version.

Why a stale sample loses its whole response, not just its old tokens: versions only grow
along a response, so its stale tokens are its first ones, and every later token was
conditioned on them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from miles_lite.engine.versions import WeightVersions
from miles_lite.rollout.config import StalenessPolicy
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus

__all__ = [
    "StalenessGate",
    "Verdict",
    "group_lag",
    "reset_stale_samples",
    "sample_lag",
    "staleness_metrics",
]


def sample_lag(sample: Sample, versions: WeightVersions) -> int | None:
    """Updates between the sample's oldest token and the current version; None when it
    holds no versioned token (:func:`group_lag` of the sample alone)."""
    return group_lag((sample,), versions)


def group_lag(group: Sequence[Sample], versions: WeightVersions) -> int | None:
    """The largest lag of the group's samples (its oldest token's); None when none holds a
    versioned token."""
    # Each distinct version's lag once, not each span's: a group's spans name one or two.
    found = {span.version for sample in group for span in sample.weight_spans}
    return max(map(versions.lag, found)) if found else None


def reset_stale_samples(group: Sequence[Sample], versions: WeightVersions, max_lag: int) -> int:
    """Reset, in place, every sample lagging more than ``max_lag`` to its prompt
    (PENDING, no response, no reward), so that generating the group again makes it under
    the current version; returns how many were reset. The group's reward is cleared where
    it was given per group."""
    reset = 0
    for sample in group:
        lag = sample_lag(sample, versions)
        if lag is None or lag <= max_lag:
            continue
        prompt_len = len(sample.tokens) - sample.response_length
        sample.tokens = sample.tokens[:prompt_len]
        sample.response = ""
        sample.response_length = 0
        sample.loss_mask = None
        sample.rollout_log_probs = None
        sample.weight_versions = []
        sample.weight_spans = []
        sample.status = SampleStatus.PENDING
        sample.status_reason = None
        sample.finish_reason = None
        sample.matched_stop = None
        sample.reward = None
        sample.error = None
        sample.request_id = None
        sample.turns = 0
        sample.session = None
        sample.non_generation_time = 0.0
        sample.prefix_cache_info = PrefixCacheInfo()
        reset += 1
    return reset


def staleness_metrics(
    groups: Iterable[Sequence[Sample]],
    versions: WeightVersions,
    *,
    lags: Sequence[int] | None = None,
) -> dict[str, float]:
    """``rollout/staleness_mean`` / ``_max`` / ``_min``: the lag of each group (in weight
    updates, 0 = every token by the current version), and ``rollout/tokens_per_version/<v>``:
    model tokens per version (over the versions' spans), for the groups given. ``lags``:
    the groups' lags as they were when handed over (default: as they are now)."""
    found: list[int] = []
    tokens: Counter[str] = Counter()
    for group in groups:
        lag = group_lag(group, versions) if lags is None else None
        if lag is not None:
            found.append(lag)
        for sample in group:
            for span in sample.weight_spans:
                tokens[span.version] += span.end - span.start
    if lags is not None:
        found = list(lags)
    metrics: dict[str, float] = {}
    if found:
        metrics["rollout/staleness_mean"] = sum(found) / len(found)
        metrics["rollout/staleness_max"] = float(max(found))
        metrics["rollout/staleness_min"] = float(min(found))
    for version, count in tokens.items():
        metrics[f"rollout/tokens_per_version/{version}"] = float(count)
    return metrics


#: What :meth:`StalenessGate.check` decides for a group.
Verdict = Literal["fresh", "dropped", "resumed"]


class StalenessGate:
    """The one decision on stale groups, for :meth:`Rollout.run
    <miles_lite.training.rollout.Rollout.run>` and :class:`GroupStream
    <miles_lite.training.stream.GroupStream>` alike: a group lagging more than
    ``max_staleness`` updates is never handed over; by ``policy`` it is dropped, or its
    stale samples are reset to their prompts (:func:`reset_stale_samples`) so it is
    generated again. Counts what it refused and the lags of what it let through, and
    writes them as metrics (:meth:`metrics`). ``max_staleness=None``: every group passes.
    """

    __slots__ = (
        "dropped",
        "lags",
        "max_staleness",
        "policy",
        "resumed",
        "resumed_samples",
        "versions",
    )

    def __init__(
        self,
        versions: WeightVersions,
        max_staleness: int | None,
        policy: StalenessPolicy | str = StalenessPolicy.DROP,
    ) -> None:
        self.versions = versions
        self.max_staleness = max_staleness
        self.policy = StalenessPolicy(policy)
        self.dropped = 0
        self.resumed = 0
        self.resumed_samples = 0
        self.lags: list[int] = []  # of the groups let through, when they were checked

    def check(self, group: Sequence[Sample]) -> Verdict:
        """``"fresh"`` (hand it over), ``"dropped"`` or ``"resumed"`` (its stale samples
        were reset in place; start it again or return it as partial)."""
        limit = self.max_staleness
        lag = group_lag(group, self.versions)
        if limit is None or lag is None or lag <= limit:
            if lag is not None:
                self.lags.append(lag)
            return "fresh"
        if self.policy is StalenessPolicy.DROP:
            self.dropped += 1
            return "dropped"
        self.resumed += 1
        self.resumed_samples += reset_stale_samples(group, self.versions, limit)
        return "resumed"

    def metrics(self, handed: Iterable[Sequence[Sample]]) -> dict[str, float]:
        """``rollout/staleness_dropped_groups`` / ``_resumed_groups`` / ``_resumed_samples``
        (only with a bound), and :func:`staleness_metrics` of the ``handed`` groups at the
        lags they had when checked."""
        metrics: dict[str, float] = {}
        if self.max_staleness is not None:
            metrics["rollout/staleness_dropped_groups"] = float(self.dropped)
            metrics["rollout/staleness_resumed_groups"] = float(self.resumed)
            metrics["rollout/staleness_resumed_samples"] = float(self.resumed_samples)
        metrics.update(staleness_metrics(handed, self.versions, lags=self.lags))
        return metrics
