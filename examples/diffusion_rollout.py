"""A diffusion rollout from a script: stand-in engines, parser pool, a reward defined here.

python examples/diffusion_rollout.py
"""

from __future__ import annotations

from miles_lite import (
    DiffusionRollout,
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    Sample,
    run_sync,
)
from miles_lite.testing import EngineProcessGroup, StandInConfig


def brightness(samples: list[Sample]) -> list[float]:
    """A reward defined in __main__: it still runs in the reward pool's workers."""
    return [float(s.generated_output.float().mean()) for s in samples]  # type: ignore[union-attr]


async def main(urls: list[str]) -> None:
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=4,
        microgroup_size=2,
        sampling=DiffusionSamplingParams(num_inference_steps=8),
        reward="brightness",
    )
    async with DiffusionRollout.open(
        urls, config=config, rewards={"brightness": brightness}
    ) as rollout:
        for step in range(2):  # pools and arena are reused across rollouts
            result = await rollout.run(["a cat", "a dog"])
            rewards = [round(float(s.reward), 3) for s in result.samples]  # type: ignore[arg-type]
            print(f"rollout {step}: {result.metrics['perf/rollout_time']:.2f} s, rewards {rewards}")


if __name__ == "__main__":
    with EngineProcessGroup([StandInConfig(step_latency_s=0.01)] * 2) as engines:
        run_sync(main, engines.urls)
