"""Worker pools: parser (decode off the loop, hand tensors over in shared memory) and reward
(local processes, or a Dask cluster: :class:`DaskRewardPool`)."""

from miles_lite.pools.arena import Arena, ArenaConfig, Lease
from miles_lite.pools.dask_pool import DaskRewardPool
from miles_lite.pools.parser_pool import ParsedBody, ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import (
    ApiRewardPool,
    RewardFn,
    RewardPool,
    RewardPoolLike,
    RewardPoolStatistics,
    reward_view,
)
from miles_lite.pools.worker_pool import (
    ExecutorFactory,
    PoolWindow,
    PoolWindows,
    WorkerPool,
    process_executor_factory,
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
