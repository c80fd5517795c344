"""An agent's merged sample across a weight update: weight_spans over its model tokens
(each turn's meta_info.weight_versions, offset into the trajectory), kv_version marks on
tokens made on KV from before an in_place update, and the turns after the update under
the new version (issue 31.2)."""

from __future__ import annotations

from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.sglang.control import PauseMode
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.types import SampleStatus, WeightSpan
from tests.support.polling import wait_until
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio

#: 40 tokens a turn at 10 ms: the update lands inside the first turn.
SLOW = TextStandInConfig(policy=TextPolicy(default_length=40), token_latency_s=0.01)


async def two_turns(base_url: str, prompt: Any, request_kwargs: dict[str, Any]) -> float:
    """Two turns, the second extending the first (token in)."""
    messages = list(prompt)
    async with aiohttp.ClientSession() as http:
        for question in ("Count with me", "And again"):
            if len(messages) > 1:
                messages.append({"role": "user", "content": question})
            body = {"model": "m", "messages": messages, **request_kwargs}
            async with http.post(f"{base_url}/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            messages.append(answer["choices"][0]["message"])
    return 1.0


async def test_a_merged_agent_sample_carries_spans_and_kv_marks_across_an_update(
    tokenizer: Any,
) -> None:
    sampling = TextSamplingParams(max_new_tokens=64)  # turns end by themselves (stop)
    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        sampling=sampling,
        weight_update=WeightUpdateConfig(mode=PauseMode.IN_PLACE),
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=8),
            client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
        ),
    )
    generate = AgentGenerate(two_turns, sessions=IN_PROCESS)
    async with (
        TextStandInEngine(SLOW, tokenizer) as engine,
        TextRollout.open(
            [engine.url], tokenizer=tokenizer, config=config, generate=generate
        ) as rollout,
    ):
        results: list[Any] = []

        async def run() -> None:
            results.append(await rollout.run([[{"role": "user", "content": "Count with me"}]]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_until(lambda: engine.stats.generated_tokens >= 5)
            report = await rollout.update_weights(None, version="1")
            assert report.ok and report.kept_kv
        chat = [b for b in engine.statistics().requests if "messages" in b]
    ((sample,),) = [r.samples for r in results]
    assert sample.status is SampleStatus.COMPLETED
    assert sample.session is not None and sample.session.turns == 2
    # The first turn went out before the update (no key), the second after it.
    assert ["extra_key" in b for b in chat] == [False, True]
    assert chat[1]["extra_key"] == "miles-lite-weights:1"
    first, second, third = sample.weight_spans
    assert (first.version, first.kv_version, first.start) == ("default", None, 0)
    # The rest of turn 1 made by version 1 on the KV "default" computed: marked.
    assert (second.version, second.kv_version, second.start) == ("1", "default", first.end)
    # Turn 2: version 1 on its own KV, at its offset past the tokens between the turns.
    assert (third.version, third.kv_version) == ("1", None)
    mask = sample.loss_mask
    assert mask is not None
    covered = [i for span in sample.weight_spans for i in range(span.start, span.end)]
    assert covered == [i for i, m in enumerate(mask) if m == 1]  # exactly the model tokens
    assert third.end == sample.response_length and third.start > second.end
    assert all(isinstance(span, WeightSpan) for span in sample.weight_spans)
