"""A journaled diffusion rollout keeps each sample's metadata, seed and reward, and
references its tensors (dtype and shape) instead of copying them into the journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_lite import DiffusionRollout, DiffusionRolloutConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import StandInConfig, StandInEngine
from miles_lite.types import Sample

pytestmark = pytest.mark.anyio


class OutputMean:
    """The mean of each sample's output (an async scorer, on the loop: tiny tensors)."""

    async def score(self, samples: list[Sample]) -> list[float]:
        return [float(s.generated_output.float().mean()) for s in samples]  # type: ignore[union-attr]


async def test_diffusion_samples_keep_metadata_and_rewards_and_reference_tensors(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.db"
    config = DiffusionRolloutConfig(n_samples_per_prompt=4, transport="inline", reward="mean")
    prompts = [
        PromptGroup(prompt=f"a cat {i}", metadata={"prompt_id": i, "style": "ink"})
        for i in range(2)
    ]
    async with StandInEngine(StandInConfig(step_latency_s=0.001)) as engine:
        async with DiffusionRollout.open(
            [engine.url], config=config, rewards={"mean": OutputMean()}, journal=path
        ) as rollout:
            result = await rollout.run(prompts)
        async with DiffusionRollout.open(
            [engine.url], config=config, rewards={"mean": OutputMean()}, journal=path
        ) as rollout:
            state = await rollout.resume()
    assert state.step is None and state.pending == []
    assert len(state.handed) == 2
    for before, after in zip(result.groups, state.handed, strict=True):
        assert [s.reward for s in after] == [s.reward for s in before]
        assert [s.seed for s in after] == [s.seed for s in before]
        assert [s.index for s in after] == [s.index for s in before]
        for old, new in zip(before, after, strict=True):
            assert new.metadata["style"] == "ink" and new.prompt == old.prompt
            assert old.generated_output is not None and new.generated_output is None
            dtype, shape = new.metadata["journal_tensors"]["generated_output"]
            assert dtype == str(old.generated_output.dtype)
            assert shape == list(old.generated_output.shape)
            assert new.dit_trajectory is None
            if old.dit_trajectory is not None and old.dit_trajectory.latents is not None:
                ref = new.metadata["journal_tensors"]["dit_trajectory.latents"]
                assert ref[1] == list(old.dit_trajectory.latents.shape)
