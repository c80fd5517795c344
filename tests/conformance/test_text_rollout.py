"""TextRollout against the real SGLang server: real token ids, log-probs and finish reasons
satisfy the sample invariants, single turn and multi-turn; an oversampled rollout stops
early with partial output and nothing left running; weight versions change between two
rollouts."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rollout.contract import GenerateFn, GenerateFnInput
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
from miles_lite.text.rollout import TextRollout, TextRolloutConfig
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.text.tool_calls import ToolCall
from miles_lite.types import SampleStatus

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def rollout_on(
    url: str,
    tokenizer: Any,
    *,
    generate: GenerateFn | None = None,
    **config: Any,
) -> AsyncIterator[TextRollout]:
    config.setdefault("sampling", TextSamplingParams(max_new_tokens=8))
    config.setdefault("engines", EngineConfig(router=RouterConfig(max_inflight_per_engine=64)))
    async with TextRollout.open(
        [url], tokenizer=tokenizer, config=TextRolloutConfig(**config), generate=generate
    ) as rollout:
        yield rollout


def assert_real_log_probs(values: Any) -> None:
    assert all(isinstance(x, float) and x <= 0.0 and math.isfinite(x) for x in values)


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
        sample.validate()
        assert sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
        assert 0 < sample.response_length <= 8
        if sample.status is SampleStatus.TRUNCATED:
            assert sample.response_length == 8
        assert sample.loss_mask == [1] * sample.response_length
        assert sample.rollout_log_probs is not None
        assert_real_log_probs(sample.rollout_log_probs)
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
        reply = await rollout.context.router.client.post_json(
            sglang_url, "/update_weight_version", {"new_version": version}
        )
        assert reply["success"] is True
        after = await rollout.run(["Hello there"])
    assert version not in {v for s in before.samples for v in s.weight_versions}
    assert {v for s in after.samples for v in s.weight_versions} == {version}


# A random-weight model never writes a tool call, and rarely its end-of-turn token. So
# every token id is a stop token here (each turn is one real token ending in "stop"), and
# the parser reads every turn as a call: the rollout goes through max_turns real turns.
EVERY_TOKEN_STOPS = TextSamplingParams(
    max_new_tokens=8, temperature=0.0, stop_token_ids=list(range(160_000))
)


async def echo(name: str, arguments: dict[str, Any]) -> str:
    return f"{name} ran with {arguments}"


async def test_multi_turn_samples_hold_every_turn_of_the_real_server(
    sglang_url: str, tokenizer: Any
) -> None:
    options = MultiTurnOptions(
        max_turns=3,
        parser=lambda text: [ToolCall(name="lookup", arguments={"q": 1})],
        execute_tool=echo,
    )
    async with rollout_on(
        sglang_url,
        tokenizer,
        generate=MultiTurn(options),
        n_samples_per_prompt=2,
        sampling=EVERY_TOKEN_STOPS,
    ) as rollout:
        result = await rollout.run(["Look something up, then answer."])
        client = rollout.context.router.client
        for sample in result.samples:
            assert sample.error is None, sample.error
            sample.validate()
            assert sample.status is SampleStatus.TRUNCATED
            mask, log_probs = sample.loss_mask, sample.rollout_log_probs
            assert mask is not None and isinstance(log_probs, list)
            assert sample.turns == 3
            assert sample.status_reason == "max_turns"
            # The last turn's real finish reason: a stop token, the one it generated.
            assert sample.finish_reason == "stop"
            assert sample.matched_stop == sample.tokens[-1 - mask[::-1].index(1)]
            # one model token (mask 1) then the tool turn's tokens (mask 0), three times
            starts = [i for i, m in enumerate(mask) if m == 1]
            assert len(starts) == 3 and starts[0] == 0
            assert all(mask[i + 1] == 0 for i in starts)
            assert all(log_probs[i] == 0.0 for i, m in enumerate(mask) if m == 0)
            assert_real_log_probs([log_probs[i] for i in starts])
            prompt_len = len(sample.tokens) - sample.response_length
            assert "lookup ran with {'q': 1}" in tokenizer.decode(sample.tokens[prompt_len:])
            # Token in, token out: given everything before it, the real server's greedy
            # token and log-prob at each model position are the sample's.
            for i in starts:
                answer = await client.post_json(
                    sglang_url,
                    "/generate",
                    {
                        "input_ids": sample.tokens[: prompt_len + i],
                        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                        "return_logprob": True,
                    },
                )
                ((lp, tok, _),) = answer["meta_info"]["output_token_logprobs"]
                assert tok == sample.tokens[prompt_len + i]
                assert lp == pytest.approx(log_probs[i], abs=1e-3)


async def test_oversampled_rollout_stops_early_with_partial_output_then_resumes(
    sglang_url: str, tokenizer: Any
) -> None:
    """Group 0 answers with one token once the other groups' long generations are all
    running at the engine and have had a second to make tokens. The stop aborts them
    there: they come back ABORTED with that partial output, /v1/loads reports nothing
    running, and a second run resumes them from where they stopped."""

    async def running_at_engine() -> int:
        async with aiohttp.ClientSession() as http, http.get(sglang_url + "/v1/loads") as resp:
            loads = (await resp.json())["loads"]
        return sum(int(x["num_running_reqs"]) for x in loads)

    async def first_group_last(input: GenerateFnInput) -> Any:
        if input.sample.group_index == 0:
            with anyio.fail_after(60):
                while True:
                    if await running_at_engine() >= 4:
                        break
                    await anyio.sleep(0.1)
            await anyio.sleep(1.0)
            input.sampling_params["max_new_tokens"] = 1
        return await single_turn(input)

    budget = 400  # far more than the others can make while group 0 waits
    async with rollout_on(
        sglang_url,
        tokenizer,
        generate=first_group_last,
        n_samples_per_prompt=2,
        rollout_batch_size=1,
        over_sampling_batch_size=3,
        sampling=TextSamplingParams(max_new_tokens=budget, extra={"ignore_eos": True}),
    ) as rollout:
        first = await rollout.run(["Count to ten.", "Name a colour.", "Say hello."])
        assert await running_at_engine() == 0
        assert [g[0].prompt for g in first.groups] == ["Count to ten."]
        partial = [s for g in first.partial for s in g]
        assert len(partial) == 4
        for sample in partial:
            assert sample.status is SampleStatus.ABORTED, (sample.status, sample.error)
            assert 0 < sample.response_length < budget
            sample.validate()
            assert sample.reward is None
        resumed_from = {s.seed: s.tokens for s in partial}
        # Resume to a few tokens past the longest partial output (not the whole budget:
        # the point is that each continues from its own tokens).
        until = max(s.response_length for s in partial) + 4
        everything = dataclasses.replace(
            rollout.config,
            rollout_batch_size=None,
            over_sampling_batch_size=None,
            sampling=TextSamplingParams(max_new_tokens=until, extra={"ignore_eos": True}),
        )
        resume = TextRollout(config=everything, router=rollout.context.router, tokenizer=tokenizer)
        second = await resume.run(first.partial)
    assert len(second.samples) == 4
    for sample in second.samples:
        assert sample.error is None, sample.error
        sample.validate()
        assert sample.status is SampleStatus.TRUNCATED and sample.response_length == until
        before = resumed_from[sample.seed]
        assert sample.tokens[: len(before)] == before  # continued, not started over
