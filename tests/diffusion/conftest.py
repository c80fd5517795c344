from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import RewardPool
from miles_lite.testing import StandInConfig, StandInEngine
from tests.diffusion import rewards


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(scope="module")
async def parser() -> AsyncIterator[ParserPool]:
    config = ParserPoolConfig(
        workers=2, arena=ArenaConfig(size_bytes=64 << 20, page_bytes=16 << 10)
    )
    async with ParserPool(config) as pool:
        yield pool


@pytest.fixture(scope="module")
async def reward_pools() -> AsyncIterator[dict[str, RewardPool]]:
    async with (
        RewardPool("mean", rewards.output_mean, workers=2) as mean,
        RewardPool("slow", rewards.slow_output_mean, workers=1) as slow,
        RewardPool("dogs", rewards.fails_on_dogs, workers=1) as dogs,
        RewardPool("group", rewards.group_size, workers=1) as group,
        RewardPool("minus", rewards.minus_one, workers=1) as minus,
    ):
        yield {"mean": mean, "slow": slow, "dogs": dogs, "group": group, "minus": minus}


@pytest.fixture
async def engines() -> AsyncIterator[list[StandInEngine]]:
    config = StandInConfig(step_latency_s=0.005)
    async with StandInEngine(config) as a, StandInEngine(config) as b:
        yield [a, b]
