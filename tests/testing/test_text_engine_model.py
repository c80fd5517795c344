"""The text stand-in's second policy: a tiny random-weight Qwen2 model with real log-probs."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import torch

from miles_lite.testing import TextStandInConfig, TextStandInEngine, TinyModelPolicy

from .test_text_engine import post

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_the_tiny_model_answers_with_log_probs_a_test_can_recompute(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    before = torch.random.get_rng_state()
    config = TextStandInConfig(policy=TinyModelPolicy(seed=3))
    async with TextStandInEngine(config, tokenizer) as engine:
        assert torch.equal(before, torch.random.get_rng_state())  # global RNG untouched
        url = f"{engine.url}/generate"

        async def generate(rid: str, **params: Any) -> Any:
            body = {
                "input_ids": [1, 2, 3, 4],
                "rid": rid,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 6, **params},
            }
            status, answer = await post(http, url, body)
            assert status == 200, answer
            return answer

        first, again, other = await generate("a"), await generate("a"), await generate("b")
        greedy = await generate("c", temperature=0.0)
        model = engine.model
        assert model is not None
        recomputed = model.logprobs([1, 2, 3, 4], first["output_ids"])
    assert first["output_ids"] == again["output_ids"] != other["output_ids"]
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    reported = [lp for lp, _, _ in first["meta_info"]["output_token_logprobs"]]
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(reported, recomputed, strict=True))
    assert all(lp < 0 for lp in reported)
    greedy_lps = [lp for lp, _, _ in greedy["meta_info"]["output_token_logprobs"]]
    assert len(greedy_lps) == 6 and max(greedy_lps) > min(reported) - 5
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelPolicy(hidden_size=30)
