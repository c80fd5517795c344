"""A weight update while more generations are in flight to an engine than the client has
connections to it (``max_connections_per_host``): the generations the pause holds keep
their connections, and the rest wait in the pool for one. The update's control calls go
on connections of their own (``control_connections_per_host``), so the update is done
while every generation is still held; before, its pause queued behind the generations and
the update failed at its control timeout (with streamed groups, hung until the 300 s load
timeout: ``benchmarks/journal.py``'s GRPO loop, found there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio

TOKENS = 400  # 20 s a request at 50 ms a token: far longer than the test runs


async def test_an_update_is_not_held_up_by_generations_holding_every_connection(
    tokenizer: Any, tmp_path: Path
) -> None:
    stand_in = TextStandInConfig(
        token_latency_s=0.05, max_running=64, policy=TextPolicy(default_length=TOKENS)
    )
    config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=TOKENS, extra={"ignore_eos": True}),
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=16),
            client=EngineClientConfig(
                max_connections_per_host=4, retry=RetryPolicy(max_attempts=1)
            ),
        ),
        # Each control call bounded far below one generation: one queued behind the
        # generations fails the update.
        weight_update=WeightUpdateConfig(control_timeout_s=5.0, load_timeout_s=5.0),
    )
    prompts = [PromptGroup(prompt=f"prompt {i}") for i in range(4)]
    async with (
        TextStandInEngine(stand_in, tokenizer) as engine,
        TextRollout.open([engine.url], tokenizer=tokenizer, config=config) as rollout,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(rollout.run, prompts)
        # 4 generating (every connection), 12 waiting in the pool for one.
        await wait_until(lambda: engine.stats.running == 4)
        report = await rollout.update_weights(tmp_path, version="v1")
        assert report.took == (engine.url,) and report.behind == ()
        assert engine.stats.pauses == 1
        # Nothing had to end for the update to get through: the 4 still generate.
        assert engine.stats.running == 4 and engine.stats.generated_tokens < 4 * TOKENS
        tg.cancel_scope.cancel()
