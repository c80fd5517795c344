"""Worker pools: parser (decode off the loop, hand tensors over in shared memory) and reward."""

from miles_lite.pools.arena import Arena, ArenaConfig, Lease
from miles_lite.pools.parser_pool import ParsedBody, ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import (
    ApiRewardPool,
    RewardFn,
    RewardPool,
    RewardPoolLike,
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
    "WorkerPool",
    "process_executor_factory",
    "reward_view",
]
