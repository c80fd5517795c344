"""A rollout composed: the driver (scheduling, early stop), the scorer (rewards), the
filters, and a kind (units, generate, abort, metrics); ``run`` numbers the prompts'
groups and hands them to the driver.

:class:`~miles_lite.DiffusionRollout` and :class:`~miles_lite.TextRollout` are built on
it: each brings its kind and its typed context, and an ``open`` that makes the parts.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from miles_lite.pools.arena import Arena
from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool, RewardPoolLike
from miles_lite.rollout.config import RolloutConfig
from miles_lite.rollout.driver import Driver, RolloutKind
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.groups import GroupSpec, make_groups
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.scoring import Scorer
from miles_lite.rollout.startup import startup_step

__all__ = ["Rollout", "open_reward_pools"]

_log = logging.getLogger(__name__)


class Rollout:
    """The parts of a rollout and ``run``: see the module docstring.

    ``rewards``: reward pools by kind; ``dynamic_filter``: one filter or a list;
    ``progress``: a progress bar in samples; ``max_started_samples``: the driver's bound
    on samples of groups started and not done; ``engines``: the engines' URLs (given to
    each result, so a trace shows idle engines too). Raises ``ConfigError`` when a reward
    kind of the config has no pool.
    """

    #: Whether prompts may be chat ``messages`` lists (text) or only strings (diffusion).
    chat_prompts = True

    def __init__(
        self,
        *,
        config: RolloutConfig,
        kind: RolloutKind,
        rewards: Mapping[str, RewardPoolLike] | None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None,
        progress: bool,
        max_started_samples: int,
        engines: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.engines = tuple(engines)
        self.kind = kind
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

    @property
    def rewards(self) -> dict[str, RewardPoolLike]:
        """The reward pools by kind."""
        return self.scorer.rewards

    def make_groups(self, prompts: Sequence[GroupSpec], rollout_id: int = 0) -> list[list[Any]]:
        """The samples of each prompt, numbered and seeded (see :func:`make_groups`)."""
        config = self.config
        return make_groups(
            prompts,
            n_samples=config.n_samples_per_prompt,
            seed=config.seed,
            rollout_id=rollout_id,
            chat=self.chat_prompts,
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
        typed error, the cause kept. Raises ``ConfigError`` before anything is sent when
        ``prompts`` is not a list of prompts (:func:`~miles_lite.rollout.groups.check_prompts`
        names the index). An empty list gives an empty result, logged, with
        ``rollout/prompts`` 0. Cancelling ``run`` stops the engines' work for it.
        Runs may overlap on one rollout: each has its own stop signal and requests.
        """
        if rollout_id is None:
            rollout_id = next(self._rollout_ids)
        groups = self.make_groups(prompts, rollout_id)
        if not groups:
            _log.warning("run() got no prompts: the result is empty (rollout/prompts = 0)")
        result = await self.driver.run(
            groups,
            target=self.config.rollout_batch_size,
            batch_size=self.config.over_sampling_batch_size,
            rollout_id=rollout_id,
        )
        result.metrics["rollout/prompts"] = float(len(groups))
        result.engines = self.engines
        return result


async def open_reward_pools(
    stack: AsyncExitStack,
    rewards: Mapping[str, Any],
    config: RolloutConfig,
    *,
    arena: Arena | None,
) -> dict[str, RewardPoolLike]:
    """Reward pools by kind from functions (a :class:`RewardPool` of
    ``config.reward_workers`` processes each, calls bounded by ``config.reward_timeout_s``),
    async scorers with ``score`` (an :class:`ApiRewardPool`) or ready pools; the pools
    this starts are closed with ``stack``."""
    pools: dict[str, RewardPoolLike] = {}
    for kind, spec in rewards.items():
        if hasattr(spec, "measure") and hasattr(spec, "score"):
            pools[kind] = spec
        elif hasattr(spec, "score"):
            pools[kind] = ApiRewardPool(kind, spec)
        else:
            name = getattr(spec, "__qualname__", None) or type(spec).__name__
            with startup_step(
                f"starting reward pool {kind!r} ({config.reward_workers} worker(s) of {name})"
            ):
                pools[kind] = await stack.enter_async_context(
                    RewardPool(
                        kind,
                        spec,
                        workers=config.reward_workers,
                        arena=arena,
                        timeout_s=config.reward_timeout_s,
                    )
                )
    return pools
