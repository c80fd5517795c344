"""Worker pools: parser (decode off the loop, hand tensors over in shared memory) and reward
(local processes, or a Dask cluster: :class:`DaskRewardPool`)."""

import typing

from miles_lite._core.lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from miles_lite.pools.arena import Arena, ArenaConfig, Lease
    from miles_lite.pools.dask_pool import DaskRewardPool
    from miles_lite.pools.parser_pool import ParsedBody, ParserPool, ParserPoolConfig
    from miles_lite.pools.reward_base import (
        RewardFn,
        RewardPoolLike,
        RewardPoolStatistics,
        reward_view,
    )
    from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool
    from miles_lite.pools.worker_pool import (
        ExecutorFactory,
        PoolWindow,
        PoolWindows,
        WorkerPool,
        process_executor_factory,
    )

# Imported when first used: parser workers import this package's light modules (page
# table, worker side of the arena) and must not import torch through parser_pool.
__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "miles_lite.pools.arena": ["Arena", "ArenaConfig", "Lease"],
        "miles_lite.pools.dask_pool": ["DaskRewardPool"],
        "miles_lite.pools.parser_pool": ["ParsedBody", "ParserPool", "ParserPoolConfig"],
        "miles_lite.pools.reward_base": [
            "RewardFn",
            "RewardPoolLike",
            "RewardPoolStatistics",
            "reward_view",
        ],
        "miles_lite.pools.reward_pool": ["ApiRewardPool", "RewardPool"],
        "miles_lite.pools.worker_pool": [
            "ExecutorFactory",
            "PoolWindow",
            "PoolWindows",
            "WorkerPool",
            "process_executor_factory",
        ],
    },
)

__all__ = [
    "ApiRewardPool",
    "Arena",
    "ArenaConfig",
    "DaskRewardPool",
    "ExecutorFactory",
    "Lease",
    "ParsedBody",
    "ParserPool",
    "ParserPoolConfig",
    "PoolWindow",
    "PoolWindows",
    "RewardFn",
    "RewardPool",
    "RewardPoolLike",
    "RewardPoolStatistics",
    "WorkerPool",
    "process_executor_factory",
    "reward_view",
]
