"""A job a test kills: parser and reward pools up, then it waits (run as a script)."""

from __future__ import annotations

import sys

import anyio

from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import RewardPool
from tests.pools import work


async def main() -> None:
    config = ParserPoolConfig(workers=2, arena=ArenaConfig(size_bytes=1 << 20, populate=False))
    async with ParserPool(config) as parser, RewardPool("r", work.text_reward, workers=1) as pool:
        await pool.score([])
        await parser.pool.run(work.pid)
        print("ready", flush=True)
        await anyio.sleep(3600)


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
