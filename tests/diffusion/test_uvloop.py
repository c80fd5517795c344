"""The end-to-end rollout on uvloop (opt-in loop), pools and engines real."""

from __future__ import annotations

import pytest

from miles_lite import (
    DiffusionRollout,
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    SampleStatus,
)
from miles_lite.testing import StandInEngine


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.mark.anyio
@pytest.mark.parametrize("fetch_in_parser", [False, True])
async def test_a_rollout_runs_on_uvloop(fetch_in_parser: bool) -> None:
    import asyncio

    import uvloop

    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=3,
        microgroup_size=2,
        fetch_in_parser=fetch_in_parser,
        sampling=DiffusionSamplingParams(num_inference_steps=2),
    )
    async with (
        StandInEngine() as engine,
        DiffusionRollout.open([engine.url], config=config) as rollout,
    ):
        result = await rollout.run(["a cat", "a dog"])
    assert [s.index for s in result.samples] == list(range(6))
    assert all(s.status is SampleStatus.COMPLETED for s in result.samples)
