"""TextRollout against the real SGLang server: real token ids, log-probs and finish reasons
satisfy the sample invariants; weight versions change between two rollouts."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from miles_lite.engine.client_config import EngineClientConfig
from miles_lite.generate.text_request import check_text_sample
from miles_lite.pipeline.text_rollout import TextRollout, TextRolloutConfig
from miles_lite.sampling import TextSamplingParams
from miles_lite.testing.tokenizers import load_qwen3_tokenizer
from miles_lite.types import SampleStatus

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[Any]:
    yield load_qwen3_tokenizer()


@asynccontextmanager
async def rollout_on(url: str, tokenizer: Any, **config: Any) -> AsyncIterator[TextRollout]:
    cfg = TextRolloutConfig(sampling=TextSamplingParams(max_new_tokens=8), **config)
    async with TextRollout.open(
        [url], tokenizer=tokenizer, config=cfg, client_config=EngineClientConfig()
    ) as rollout:
        yield rollout


async def test_single_turn_samples_hold_the_real_servers_tokens(
    sglang_url: str, tokenizer: Any
) -> None:
    chat = [{"role": "user", "content": "What is 2+3?"}]
    async with rollout_on(sglang_url, tokenizer, n_samples_per_prompt=2) as rollout:
        result = await rollout.run(["What is 2+3?", chat])
    assert [len(g) for g in result.groups] == [2, 2]
    chat_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    chat_ids = chat_ids if isinstance(chat_ids, list) else list(chat_ids["input_ids"])
    for sample in result.samples:
        assert sample.error is None, sample.error
        check_text_sample(sample)
        assert sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
        assert 0 < sample.response_length <= 8
        if sample.status is SampleStatus.TRUNCATED:
            assert sample.response_length == 8
        assert sample.loss_mask == [1] * sample.response_length
        assert sample.rollout_log_probs is not None
        lps = list(sample.rollout_log_probs)
        assert all(isinstance(x, float) and x <= 0.0 and math.isfinite(x) for x in lps)
        assert len(sample.request_id or "") == 32
        assert sample.weight_versions
    assert result.groups[1][0].tokens[: len(chat_ids)] == chat_ids
    # The seeds differ within a group, and SGLang honours sampling_seed.
    assert result.groups[0][0].seed != result.groups[0][1].seed


async def test_weight_version_update_between_rollouts_shows_in_samples(
    sglang_url: str, tokenizer: Any
) -> None:
    async with rollout_on(sglang_url, tokenizer) as rollout:
        before = await rollout.run(["Hello there"])
        version = f"step-{uuid.uuid4().hex[:6]}"
        reply = await rollout.state.router.client.post_json(
            sglang_url, "/update_weight_version", {"new_version": version}
        )
        assert reply["success"] is True
        after = await rollout.run(["Hello there"])
    assert version not in {v for s in before.samples for v in s.weight_versions}
    assert {v for s in after.samples for v in s.weight_versions} == {version}
