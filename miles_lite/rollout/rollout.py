"""What every kind of rollout shares around the driver: reward pools, the scorer, the
filters, the rollout ids, the numbered groups, and ``run``.

:class:`~miles_lite.pipeline.DiffusionRollout` and :class:`~miles_lite.pipeline.TextRollout`
are its users: each brings its kind of unit (see :class:`~miles_lite.pipeline.RolloutKind`)
and its state, and may act before and after the driver runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any, Protocol

from miles_lite.pools.arena import Arena
from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool, RewardPoolLike
from miles_lite.rollout.contract import GenerateFn, GenerateFnInput
from miles_lite.rollout.driver import Driver, RolloutKind
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.groups import GroupSpec, make_groups
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.scoring import Scorer
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample

__all__ = ["RolloutBase", "RolloutSettings", "reward_pools"]


class _Sampling(Protocol):
    def to_payload(self) -> dict[str, Any]: ...


class RolloutSettings(Protocol):
    """The fields of a rollout config the shared part reads."""

    @property
    def sampling(self) -> _Sampling: ...
    @property
    def n_samples_per_prompt(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def reward(self) -> str | None: ...
    @property
    def group_reward(self) -> str | None: ...
    @property
    def rollout_batch_size(self) -> int | None: ...
    @property
    def over_sampling_batch_size(self) -> int | None: ...
    @property
    def stop_timeout_s(self) -> float: ...


class RolloutBase:
    """The scorer, the driver and ``run`` of a rollout; subclasses call :meth:`_init_driver`
    from their constructor and may override :meth:`_before_run` / :meth:`_after_run`."""

    config: RolloutSettings
    generate: GenerateFn
    generate_options: dict[str, Any]
    state: Any
    scorer: Scorer
    driver: Driver

    def _init_driver(
        self,
        kind: RolloutKind,
        rewards: Mapping[str, RewardPoolLike] | None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None,
        *,
        progress: bool,
        max_started_samples: int,
    ) -> None:
        config = self.config
        self.scorer = Scorer(rewards or {}, reward=config.reward, group_reward=config.group_reward)
        filters = [] if dynamic_filter is None else dynamic_filter
        self.driver = Driver(
            kind,
            self.scorer,
            filters=[filters] if callable(filters) else list(filters),
            progress=progress,
            stop_timeout_s=config.stop_timeout_s,
            max_started_samples=max_started_samples,
        )
        self._rollout_ids = itertools.count()

    async def call_generate(self, unit: list[Sample], span: UnitSpan) -> list[Sample]:
        """Call the generate function on one unit (a fresh copy of the sampling defaults
        each time); the samples it returns, as a list."""
        out = await self.generate(
            GenerateFnInput(
                samples=unit,
                sampling_params=self.config.sampling.to_payload(),
                state=self.state,
                span=span,
                options=self.generate_options,
            )
        )
        return [out] if isinstance(out, Sample) else list(out)

    @property
    def rewards(self) -> dict[str, RewardPoolLike]:
        """The reward pools by kind."""
        return self.scorer.rewards

    def make_groups(self, prompts: Sequence[GroupSpec], rollout_id: int = 0) -> list[list[Sample]]:
        """The samples of each prompt, numbered and seeded (see :func:`make_groups`)."""
        config = self.config
        return make_groups(
            prompts, n_samples=config.n_samples_per_prompt, seed=config.seed, rollout_id=rollout_id
        )

    async def run(
        self,
        prompts: Sequence[GroupSpec],
        *,
        rollout_id: int | None = None,
    ) -> RolloutResult:
        """Run one rollout over ``prompts`` and return the kept groups, scored.

        ``rollout_id`` picks the seeds (default: a counter that advances per call, so two
        calls never reuse noise). With ``rollout_batch_size`` the rollout stops once that
        many groups are kept; the others come back in ``result.partial``, ready to resume
        in the next ``run``. Failures of a unit (an engine error, a tool, agent or reward
        that raises, a broken invariant) do not raise: its samples come back FAILED with a
        typed error, the cause kept. Cancelling ``run`` stops the engines' work for it.
        """
        if rollout_id is None:
            rollout_id = next(self._rollout_ids)
        groups = self.make_groups(prompts, rollout_id)
        self._before_run(rollout_id)
        result = await self.driver.run(
            groups,
            target=self.config.rollout_batch_size,
            batch_size=self.config.over_sampling_batch_size,
            rollout_id=rollout_id,
        )
        self._after_run(result)
        return result

    def _before_run(self, rollout_id: int) -> None:
        """Called with the rollout's id before the driver runs."""

    def _after_run(self, result: RolloutResult) -> None:
        """Called with the driver's result before ``run`` returns it."""


async def reward_pools(
    stack: AsyncExitStack, rewards: Mapping[str, Any], *, workers: int, arena: Arena | None
) -> dict[str, RewardPoolLike]:
    """Reward pools by kind from functions, async scorers or ready pools (see the rollouts'
    ``open``); the pools this starts are closed with ``stack``."""
    pools: dict[str, RewardPoolLike] = {}
    for kind, spec in rewards.items():
        if hasattr(spec, "measure") and hasattr(spec, "score"):
            pools[kind] = spec
        elif hasattr(spec, "score"):
            pools[kind] = ApiRewardPool(kind, spec)
        else:
            pools[kind] = await stack.enter_async_context(
                RewardPool(kind, spec, workers=workers, arena=arena)
            )
    return pools
