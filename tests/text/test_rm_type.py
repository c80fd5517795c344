"""Text rewards chosen per sample by metadata["rm_type"], scored in reward pools."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.rewards.text_rewards import dapo_reward, math_reward
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from tests.text.conftest import RULES

pytestmark = pytest.mark.anyio


async def test_each_sample_is_scored_by_its_rm_type(tokenizer: Any) -> None:
    config = TextRolloutConfig(
        sampling=TextSamplingParams(max_new_tokens=16),
        n_samples_per_prompt=1,
        reward="math",
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=64),
            client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
        ),
    )
    engine = TextStandInEngine(TextStandInConfig(policy=TextPolicy(rules=RULES)), tokenizer)
    await engine.__aenter__()
    try:
        async with TextRollout.open(
            [engine.url],
            tokenizer=tokenizer,
            config=config,
            rewards={"math": math_reward, "dapo": dapo_reward},
        ) as rollout:
            result = await rollout.run(
                [
                    PromptGroup(prompt="What is 2+3?", label="5"),  # the default: math
                    PromptGroup(prompt="What is 2+3?", label="5", metadata={"rm_type": "dapo"}),
                ]
            )
    finally:
        with anyio.CancelScope(shield=True):
            await engine.aclose()
    math, dapo = result.samples
    assert math.reward == 1.0
    assert dapo.reward == {"score": 1.0, "acc": True, "pred": "5"}
