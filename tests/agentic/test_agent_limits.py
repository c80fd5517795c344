"""AgentGenerate's limits: an agent past its time budget fails its sample typed, its
session closes and its turn in flight is aborted at the engine (issue 30 D4); a reward an
agent returns is held to the reward pools' rule (finite numbers, or dicts of them), so a
NaN, an infinity or a string fails the sample with RewardError (D5)."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.errors import AgentError, ConfigError, RewardError
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.types import SampleStatus
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio

PROMPT = [{"role": "user", "content": "Count with me"}]
#: 400 tokens at 20 ms: a turn that runs 8 s unless it is aborted.
SLOW = TextStandInConfig(policy=TextPolicy(default_length=400), token_latency_s=0.02)
LONG = TextSamplingParams(max_new_tokens=400, extra={"ignore_eos": True})


@asynccontextmanager
async def agent_rollout(
    tokenizer: Any, generate: AgentGenerate, engine: TextStandInConfig, sampling: TextSamplingParams
) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
    async with (
        TextStandInEngine(engine, tokenizer) as stand_in,
        TextRollout.open(
            [stand_in.url],
            tokenizer=tokenizer,
            config=TextRolloutConfig(
                n_samples_per_prompt=1,
                sampling=sampling,
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=16),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
            ),
            generate=generate,
        ) as rollout,
    ):
        yield rollout, stand_in


def turn_body(request_kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": PROMPT, **request_kwargs}


async def slow_agent(base_url: str, prompt: Any, request_kwargs: dict[str, Any]) -> float:
    """One long turn, then more, for ever."""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.post(
                f"{base_url}/chat/completions", json=turn_body(request_kwargs)
            ) as response:
                await response.read()


def sync_slow_agent(base_url: str, prompt: Any, request_kwargs: dict[str, Any]) -> float:
    """A blocking agent (in a worker thread): turns until one is aborted."""
    while True:
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=json.dumps(turn_body(request_kwargs)).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        if answer["choices"][0]["finish_reason"] == "abort":
            return 1.0


@pytest.mark.parametrize("agent", [slow_agent, sync_slow_agent])
async def test_an_agent_past_its_time_budget_fails_typed_and_its_turn_is_aborted(
    tokenizer: Any, agent: Any
) -> None:
    generate = AgentGenerate(agent, sessions=IN_PROCESS, timeout_s=0.5)
    async with agent_rollout(tokenizer, generate, SLOW, LONG) as (rollout, engine):
        with anyio.fail_after(20):  # a guard against the hang this fixes, not a timing
            result = await rollout.run([PROMPT])
        assert generate.server.session_ids() == []  # its session was closed
        stats = generate.server.statistics()
        aborts = [body.get("rid") for body in engine.stats.aborts]
        generated = engine.stats.generated_tokens
    (sample,) = result.samples
    assert sample.status is SampleStatus.FAILED
    assert isinstance(sample.error, AgentError)
    assert "time budget" in str(sample.error) and "timeout_s=0.5" in str(sample.error)
    assert (stats.opened, stats.closed, stats.requests) == (1, 1, 1)
    assert len(aborts) >= 1  # the turn in flight was stopped at the engine
    assert generated < 400


def test_the_time_budget_is_checked() -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        AgentGenerate(slow_agent, timeout_s=0)


def returning(value: Any) -> Any:
    async def agent(base_url: str, prompt: Any, request_kwargs: dict[str, Any]) -> Any:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base_url}/chat/completions", json=turn_body(request_kwargs)) as response,
        ):
            assert response.status == 200
        return value

    return agent


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        {"acc": math.nan, "len": 1.0},
        {"reward": "x"},
        {"reward": math.nan, "metadata": {}},
        "1.0",
    ],
    ids=["nan", "inf", "-inf", "dict-nan", "reward-str", "reward-nan", "str"],
)
async def test_a_reward_the_pools_would_refuse_fails_the_agents_sample(
    tokenizer: Any, value: Any
) -> None:
    short = TextStandInConfig(policy=TextPolicy(default_length=4))
    sampling = TextSamplingParams(max_new_tokens=4)
    generate = AgentGenerate(returning(value), sessions=IN_PROCESS)
    async with agent_rollout(tokenizer, generate, short, sampling) as (rollout, _):
        result = await rollout.run([PROMPT])
    (sample,) = result.samples
    assert sample.status is SampleStatus.FAILED
    assert isinstance(sample.error, RewardError | AgentError)
    if not isinstance(value, str):
        assert isinstance(sample.error, RewardError)
        assert "finite" in str(sample.error) or "want a float" in str(sample.error)


@pytest.mark.parametrize("value", [1.0, 0, {"acc": 1.0, "len": 3}])
async def test_a_finite_reward_is_kept(tokenizer: Any, value: Any) -> None:
    short = TextStandInConfig(policy=TextPolicy(default_length=4))
    generate = AgentGenerate(returning(value), sessions=IN_PROCESS)
    async with agent_rollout(tokenizer, generate, short, TextSamplingParams(max_new_tokens=16)) as (
        rollout,
        _,
    ):
        result = await rollout.run([PROMPT])
    (sample,) = result.samples
    assert sample.status is SampleStatus.COMPLETED, sample.error
    expected = float(value) if not isinstance(value, dict) else value
    assert sample.reward == expected
