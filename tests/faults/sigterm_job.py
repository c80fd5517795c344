"""A job that holds a reward pool until it is told to stop (run by test_sigterm)."""

from __future__ import annotations

import anyio

from miles_lite import run_sync
from miles_lite.pools.reward_pool import RewardPool
from miles_lite.types import Sample


def score(samples: list[Sample]) -> list[float]:
    return [0.0 for _ in samples]


async def main() -> None:
    async with RewardPool("r", score, workers=1) as pool:
        await pool.score([Sample()])
        print("ready", flush=True)
        try:
            await anyio.sleep_forever()
        finally:
            print("closing", flush=True)  # the pool's shielded close runs next


if __name__ == "__main__":
    run_sync(main)
