"""Rewards of a rollout: per unit as it lands, and per group once the group is whole.

Each sample is scored by the pool its ``metadata["rm_type"]`` names, else the rollout's
default kind. Any failure of a pool fails only the samples it was scoring, with a
:class:`~miles_lite.errors.RewardError`: the library's pools raise it already (wrapped
once, in :class:`~miles_lite.pools.reward_base.RewardPoolBase`; an API scorer's by the
scorer) and check their scores; a pool of your own is wrapped and checked here, once
(:func:`~miles_lite.rewards.values.checked_scores`).
Cancellation propagates (rewards of work the rollout no longer needs are cancelled).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from miles_lite._core.reward_values import checked_scores
from miles_lite.errors import ConfigError, MilesLiteError, RewardError
from miles_lite.pools.reward_base import RewardPoolBase, RewardPoolLike
from miles_lite.pools.reward_pool import ApiRewardPool
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample, SampleStatus

__all__ = ["Scorer"]


class Scorer:
    """Scores samples in the rollout's reward pools (``rewards`` by kind).

    ``reward``: the default kind for per-unit scoring (``None``: none, unless a sample's
    ``metadata["rm_type"]`` names one); ``group_reward``: a kind scored once per whole
    group (miles' ``group_rm``). Raises :class:`ConfigError` when a kind has no pool.
    """

    def __init__(
        self,
        rewards: Mapping[str, RewardPoolLike],
        *,
        reward: str | None,
        group_reward: str | None,
    ) -> None:
        self.rewards = dict(rewards)
        for kind in (reward, group_reward):
            if kind is not None and kind not in self.rewards:
                raise ConfigError(
                    f"reward kind {kind!r} has no pool; have {sorted(self.rewards)}: pass"
                    f" rewards={{{kind!r}: your_reward}} (a TextRollout's open() also finds"
                    " the built-in rewards by name: miles_lite.rewards.BUILTIN_REWARDS)"
                )
        self.reward = reward
        self.group_reward = group_reward

    async def score_unit(
        self, samples: list[Sample], *, url: str | None = None, span: UnitSpan | None = None
    ) -> None:
        """Score the samples that still need a reward, batched per kind, concurrently.

        Skipped: FAILED and ABORTED samples, and samples whose reward is already set (an
        agent may set its own). ``url``: the engine that generated them, named in errors
        with the first sample's request id.
        """
        by_kind: dict[str, list[Sample]] = {}
        for sample in samples:
            if sample.status in (SampleStatus.FAILED, SampleStatus.ABORTED):
                continue
            if sample.reward is not None:
                continue
            kind = sample.metadata.get("rm_type", self.reward)
            if kind is not None:
                by_kind.setdefault(kind, []).append(sample)
        if not by_kind:
            return  # nothing to score: no task group, no checkpoint (hot path, per sample)
        if len(by_kind) == 1:
            ((kind, batch),) = by_kind.items()
            await self._score(kind, batch, url, span)
            return
        async with anyio.create_task_group() as tg:
            for kind, batch in by_kind.items():
                tg.start_soon(self._score, kind, batch, url, span)

    async def score_group(self, group: list[Sample]) -> None:
        """Score the group's living samples with ``group_reward`` (nothing if unset)."""
        alive = [s for s in group if s.status not in (SampleStatus.FAILED, SampleStatus.ABORTED)]
        if self.group_reward is not None and alive:
            await self._score(self.group_reward, alive)

    async def _score(
        self, kind: str, batch: list[Sample], url: str | None = None, span: UnitSpan | None = None
    ) -> None:
        pool = self.rewards.get(kind)
        try:
            if pool is None:
                raise RewardError(f"no reward pool for kind {kind!r}; have {sorted(self.rewards)}")
            scores: list[float | dict[str, Any]]
            if span is not None:
                span.reward_pool = kind
            if isinstance(pool, RewardPoolBase):
                on_worker = None if span is None else _WorkerOf(span)
                scores = await pool.score(batch, on_worker=on_worker)  # checked there
            elif isinstance(pool, ApiRewardPool):
                scores = await pool.score(batch)  # checked there
            else:
                scores = checked_scores(kind, await pool.score(batch), batch)
        except Exception as exc:
            error = (
                exc
                if isinstance(exc, RewardError)
                else RewardError(f"reward {kind!r} failed: {type(exc).__name__}: {exc}")
            )
            if error is not exc:
                error.__cause__ = exc
            if isinstance(exc, MilesLiteError):
                error.with_context(url=exc.url, request_id=exc.request_id)
            error.with_context(url=url, request_id=batch[0].request_id)
            for sample in batch:
                sample.fail(error)
            return
        for sample, value in zip(batch, scores, strict=True):
            sample.reward = value


class _WorkerOf:
    """Records in ``span`` the reward worker a pool picked (a trace's track)."""

    __slots__ = ("span",)

    def __init__(self, span: UnitSpan) -> None:
        self.span = span

    def __call__(self, index: int) -> None:
        self.span.reward_worker = index
