"""An agent's turns across a weight update, against the real SGLang server (issue 31.2):
the real ``openai`` client speaks through the rollout's session server, its second turn
runs across a ``retract`` update, and the merged sample's ``weight_spans`` go old -> new
with every model token's log-prob equal to what the weights of its span give (a
transformers forward of the tiny model, 1e-4), as the ``/generate`` test of
``test_training`` checks it.

Greedy sampling: SGLang's greedy path returns the log-softmax of the raw logits, so the
forward is comparable, and the first turn can be replayed to stop at a token a probe of
it produced (a random model rarely stops by itself; merging ends at a turn that is not
COMPLETED). The server's weights are put back at the end (``served_model``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import openai
import pytest

from miles_lite import SampleStatus, TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.engine.config import EngineConfig, RouterConfig
from tests.agentic.agents_plain import SSL_CONTEXT
from tests.conformance.test_training import (  # noqa: F401 (fixtures)
    LOGPROB_TOLERANCE,
    _save,
    logprobs,
    perturbed,
    running,
    served_model,
    trainer,
)
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio

QUESTION = [{"role": "user", "content": "Count slowly to one hundred:"}]
#: The second turn's budget: long enough on this CPU for the update to land inside it.
TURN_TWO_TOKENS = 160


async def greedy_tokens(url: str, ids: list[int], n: int) -> list[int]:
    """The real server's greedy continuation of ``ids`` (what the first turn will say)."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0},
    }
    async with aiohttp.ClientSession() as http, http.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    return list(answer["output_ids"])


async def test_an_agents_second_turn_across_a_retract_update_matches_its_weights(
    sglang_url: str,
    tokenizer: Any,
    trainer: Any,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:6]
    prompt_ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = list(prompt_ids["input_ids"])
    second_started = anyio.Event()
    finishes: list[str | None] = []

    async def agent(base_url: str, prompt: Any, request_kwargs: dict[str, Any]) -> float:
        messages = list(prompt)
        oa = openai.AsyncOpenAI(
            base_url=base_url,
            api_key="unused",
            max_retries=0,
            timeout=120,
            http_client=openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT),
        )
        try:
            extra = dict(request_kwargs.pop("extra_body", {}))
            first = await oa.chat.completions.create(
                model="m",
                messages=messages,
                **request_kwargs,
                extra_body={**extra, "stop_token_ids": [stop]},
            )
            finishes.append(first.choices[0].finish_reason)
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "Go on, slowly."},
            ]
            second_started.set()
            second = await oa.chat.completions.create(
                model="m", messages=messages, **request_kwargs, extra_body=extra
            )
            finishes.append(second.choices[0].finish_reason)
        finally:
            await oa.close()
        return 1.0

    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        sampling=TextSamplingParams(max_new_tokens=TURN_TWO_TOKENS, temperature=0.0),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=4)),
    )
    async with TextRollout.open(
        [sglang_url],
        tokenizer=tokenizer,
        config=config,
        generate=AgentGenerate(agent, sessions=IN_PROCESS),
    ) as rollout:
        base = f"{tag}-0"
        await rollout.update_weights(_save(trainer, tmp_path / "v0"), version=base)
        # The first turn stops at the first token of its greedy answer not said before
        # its third: a COMPLETED turn of 3 tokens or more, so the two turns merge.
        probe = await greedy_tokens(sglang_url, prompt_ids, 16)
        fresh = [t for i, t in enumerate(probe) if i >= 2 and t not in probe[:i]]
        stop = (fresh or probe)[0]
        new = await anyio.to_thread.run_sync(perturbed, trainer, tmp_path / "v1", 3)
        out: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                out["result"] = await rollout.run([QUESTION])

            tg.start_soon(run)
            with anyio.fail_after(120):
                await second_started.wait()
                while True:  # until the second turn is generating
                    if await running(sglang_url):
                        break
                    await anyio.sleep(0.02)
            await anyio.sleep(0.3)  # a few of its tokens first
            out["report"] = await rollout.update_weights(tmp_path / "v1", version=f"{tag}-1")
    report = out["report"]
    assert report.ok and report.flushed, report
    assert finishes == ["stop", "length"], finishes
    ((sample,),) = [out["result"].samples]
    assert sample.session is not None and sample.session.turns == 2
    assert sample.status is SampleStatus.TRUNCATED
    mask = sample.loss_mask
    assert mask is not None
    spans = sample.weight_spans
    # Turn one under the old weights, turn two old then new: versions go old -> new once.
    versions = [s.version for s in spans]
    assert versions[0] == base and versions[-1] == f"{tag}-1", spans
    assert versions == sorted(versions, key=[base, f"{tag}-1"].index), spans
    assert len(spans) == 3 and spans[0].end >= 3, spans
    assert all(s.kv_version is None for s in spans)  # retract recomputes the KV
    covered = [i for s in spans for i in range(s.start, s.end)]
    assert covered == [i for i, m in enumerate(mask) if m == 1]  # exactly the model tokens
    assert spans[-1].end == sample.response_length
    weights = {base: trainer, f"{tag}-1": new}
    got = sample.rollout_log_probs
    assert got is not None
    worst = 0.0
    for span in spans:  # every model token against the weights of its span
        expected = await anyio.to_thread.run_sync(logprobs, weights[span.version], sample)
        worst = max(worst, *(abs(got[i] - expected[i]) for i in range(span.start, span.end)))
    print(f"agent log-prob mismatch across a retract update: max {worst:.2e}, spans {spans}")
    assert worst < LOGPROB_TOLERANCE, worst
