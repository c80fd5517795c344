"""Worker pools: parser (decode off the loop, hand tensors over in shared memory) and reward
(local processes, or a Dask cluster: :class:`DaskRewardPool`)."""

from miles_lite._core.lazy import lazy_exports as _lazy_exports

# Imported when first used: parser workers import this package's light modules (page
# table, worker side of the arena) and must not import torch through parser_pool.
_EXPORTS: dict[str, list[str]] = {
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
}
__getattr__, __dir__, __all__ = _lazy_exports(__name__, _EXPORTS)
