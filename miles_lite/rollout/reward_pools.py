"""The reward pools a rollout's ``open()`` starts from what it was given: a function
becomes a pool of worker processes, an async scorer an :class:`ApiRewardPool`, a ready pool
is used as it is. Every kind's ``open()`` calls it (:class:`~miles_lite.TextRollout`,
:class:`~miles_lite.DiffusionRollout`); the pools serve the :class:`Scorer
<miles_lite.rollout.scoring.Scorer>`."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

from miles_lite.pools.arena import Arena
from miles_lite.pools.reward_base import RewardPoolLike
from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool
from miles_lite.rollout.config import RolloutConfig
from miles_lite.rollout.startup import startup_step

__all__ = ["open_reward_pools"]


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
