"""AgentGenerate through TextRollout: agents over sessions, their samples, the abort hook."""

from __future__ import annotations

import statistics
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AbortContext, AgentGenerate
from miles_lite.agentic.config import SessionServerConfig
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.errors import AgentError, ConfigError
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.sglang.sampling import chat_request_kwargs
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.text.context import TextContext
from miles_lite.types import Sample, SampleStatus
from tests.support.sessions import IN_PROCESS

from . import agents, agents_plain
from .conftest import RULES

pytestmark = pytest.mark.anyio

ADD = [{"role": "user", "content": "Please add 2 and 3."}]

Open = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, TextStandInEngine]]]


@pytest.fixture
def agentic(tokenizer: Any) -> Open:
    @asynccontextmanager
    async def open_rollout(
        generate: AgentGenerate,
        *,
        engine_config: TextStandInConfig | None = None,
        rewards: dict[str, Any] | None = None,
        **config: Any,
    ) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
        engine_config = engine_config or TextStandInConfig(policy=TextPolicy(rules=RULES))
        config.setdefault("n_samples_per_prompt", 1)
        config.setdefault("sampling", TextSamplingParams(max_new_tokens=64))
        config.setdefault(
            "engines",
            EngineConfig(
                router=RouterConfig(max_inflight_per_engine=64),
                client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
            ),
        )
        async with (
            TextStandInEngine(engine_config, tokenizer) as engine,
            TextRollout.open(
                [engine.url],
                tokenizer=tokenizer,
                config=TextRolloutConfig(**config),
                generate=generate,
                rewards=rewards,
            ) as rollout,
        ):
            yield rollout, engine
            assert generate.server.session_ids() == []  # every session was closed

    return open_rollout


async def test_agent_samples_are_merged_trajectories_with_the_agents_reward(
    agentic: Open,
) -> None:
    async with agentic(AgentGenerate(agents.run_agent, sessions=IN_PROCESS)) as (rollout, engine):
        result = await rollout.run([ADD, ADD])
    assert len(result.samples) == 2
    for sample in result.samples:
        assert sample.status is SampleStatus.COMPLETED, sample.error
        assert sample.reward == 1.0 and sample.metadata["turns"] == 4  # the agent's own
        assert sample.session is not None
        assert (sample.session.turns, sample.session.tito_mismatches) == (2, 0)
        assert sample.loss_mask is not None and 0 in sample.loss_mask
        assert len(sample.loss_mask) == sample.response_length
        assert sample.prompt == ADD
    assert result.metrics["rollout/tito_session_mismatch_rate"] == 0.0
    # One length: the metric is the mean of the samples' effective lengths (model tokens;
    # the tool output between turns is masked out), not of response_length.
    effective = [s.effective_response_length for s in result.samples]
    assert effective == [sum(s.loss_mask or []) for s in result.samples]
    assert result.metrics["rollout/response_len/mean"] == statistics.fmean(effective)
    assert all(e < s.response_length for e, s in zip(effective, result.samples, strict=True))
    # the engine saw chat requests only, with the rollout's max_new_tokens as max_tokens
    assert engine.stats.chat_requests == 4
    assert all(body.get("max_tokens") == 64 for body in engine.stats.requests)


async def test_a_plain_agent_without_a_reward_gets_none(agentic: Open, tokenizer: Any) -> None:
    generate = AgentGenerate(agents_plain.run_agent, sessions=IN_PROCESS)
    async with agentic(generate) as (rollout, _):
        result = await rollout.run(["What is 2+3?"])
    (sample,) = result.samples
    assert sample.status is SampleStatus.COMPLETED and sample.reward is None  # no pool set
    # one turn of the default policy: 16 tokens and the end-of-turn token, all trained on
    assert sample.response_length == sum(sample.loss_mask or []) == 17
    assert tokenizer.decode(sample.tokens).startswith("<|im_start|>user\nWhat is 2+3?")


async def test_an_agent_that_raises_fails_its_sample_with_the_traceback(agentic: Open) -> None:
    generate = AgentGenerate(agents_plain.failing_agent, sessions=IN_PROCESS)
    async with agentic(generate) as (rollout, _):
        result = await rollout.run([ADD])
    (sample,) = result.samples
    assert sample.status is SampleStatus.FAILED
    assert isinstance(sample.error, AgentError)
    assert "the agent's own bug" in str(sample.error)
    assert "failing_agent" in sample.error.agent_traceback
    assert isinstance(sample.error.__cause__, KeyError)


async def test_early_stop_calls_the_abort_hook_exactly_once(agentic: Open) -> None:
    agents.ABORT_CALLS.clear()
    slow = TextStandInConfig(
        policy=TextPolicy(rules=RULES, default_length=300), token_latency_s=0.01
    )
    async with agentic(
        AgentGenerate(agents.run_agent, sessions=IN_PROCESS),
        engine_config=slow,
        sampling=TextSamplingParams(max_new_tokens=300),
        rollout_batch_size=1,
        over_sampling_batch_size=3,
    ) as (rollout, engine):
        with anyio.fail_after(20):
            result = await rollout.run([ADD, "slow one", "slow two"])
        assert engine.stats.running == engine.stats.waiting == 0
    assert len(result.groups) == 1 and result.groups[0][0].prompt == ADD
    assert len(agents.ABORT_CALLS) == 1
    ctx = agents.ABORT_CALLS[0]
    assert ctx.rollout_id == result.rollout_id and len(ctx.session_ids) == 2
    partial = [s for g in result.partial for s in g]
    statuses = {s.status for s in partial}
    assert SampleStatus.ABORTED in statuses
    assert statuses <= {SampleStatus.ABORTED, SampleStatus.PENDING}
    assert all(0 < s.response_length < 300 for s in partial if s.status is SampleStatus.ABORTED)


async def test_abort_without_a_hook_is_fine_and_a_raising_hook_is_reported() -> None:
    def Ctx() -> RunContext:
        return RunContext(3)

    plain = AgentGenerate(agents_plain.run_agent)
    result = await plain.abort(Ctx())
    assert not result.called and result.error is None

    def bad_hook(ctx: Any) -> None:
        raise RuntimeError("hook bug")

    raising = await AgentGenerate(agents.run_agent, abort_hook=bad_hook).abort(Ctx())
    assert raising.called and isinstance(raising.error, RuntimeError)

    async def hanging_hook(ctx: Any) -> None:
        await anyio.sleep(60)

    slow = AgentGenerate(agents.run_agent, abort_hook=hanging_hook, abort_timeout_s=0.2)
    with anyio.fail_after(2):
        timed_out = await slow.abort(Ctx())
    assert isinstance(timed_out.error, TimeoutError)
    # the module's own hook is found
    agents.ABORT_CALLS.clear()
    assert (await AgentGenerate(agents.run_agent).abort(Ctx())).called
    assert [AbortContext(rollout_id=3, session_ids=())] == agents.ABORT_CALLS


async def test_misconfiguration_is_a_config_error(tokenizer: Any) -> None:
    context = TextContext(tokenizer=tokenizer, router=None)  # type: ignore[arg-type]
    fn_input = GenerateFnInput(
        samples=[Sample(prompt=ADD)], sampling_params={}, context=context, run=RunContext(0)
    )
    with pytest.raises(ConfigError, match="no session server"):  # never bound to a rollout
        await AgentGenerate(agents.run_agent)(fn_input)
    with pytest.raises(ConfigError, match="sessions"):
        AgentGenerate(agents.run_agent, sessions="http://x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mode"):
        AgentGenerate(agents.run_agent, mode="tree")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="run_agent"):
        AgentGenerate("not callable")  # type: ignore[arg-type]


def test_chat_request_kwargs_use_openai_names() -> None:
    params = TextSamplingParams(max_new_tokens=7, temperature=0.5, stop=["x"]).to_payload()
    kwargs = chat_request_kwargs(params)
    assert kwargs["max_tokens"] == 7 and kwargs["temperature"] == 0.5 and kwargs["stop"] == ["x"]
    assert "max_new_tokens" not in kwargs and "no_stop_trim" not in kwargs


def test_sglang_extras_go_under_extra_body() -> None:
    kwargs = chat_request_kwargs({"top_k": 5, "max_new_tokens": 3, "no_stop_trim": True})
    assert kwargs == {"max_tokens": 3, "extra_body": {"top_k": 5}}


async def test_an_engine_error_fails_that_sample_and_the_others_go_on(agentic: Open) -> None:
    generate = AgentGenerate(agents_plain.picky_agent, sessions=IN_PROCESS)
    async with agentic(generate) as (rollout, _):
        result = await rollout.run(["a bad one", "a good one"])
    bad, good = result.samples
    assert bad.status is SampleStatus.FAILED and isinstance(bad.error, AgentError)
    assert "BadRequestError" in str(bad.error) and "seed" in str(bad.error)
    assert good.status is SampleStatus.TRUNCATED and good.reward == 1.0  # max_tokens=8
    assert good.response_length == 8


async def test_a_sync_agent_runs_in_a_thread_and_a_sync_hook_too(agentic: Open) -> None:
    calls: list[Any] = []
    generate = AgentGenerate(agents_plain.sync_agent, sessions=IN_PROCESS, abort_hook=calls.append)
    async with agentic(generate) as (rollout, _):
        result = await rollout.run(["What is 2+3?"])
        (sample,) = result.samples
        assert sample.status is SampleStatus.COMPLETED and sample.metadata["finish"] == "stop"
        assert (await generate.abort(RunContext(0))).called and len(calls) == 1


async def test_a_dropped_think_block_keeps_one_trajectory_with_token_in(agentic: Open) -> None:
    # Qwen3's template drops a past turn's think block; token in sends the trajectory's
    # own ids, so the engine sees what the model wrote and the session stays one sample.
    generate = AgentGenerate(agents_plain.two_user_turns, sessions=IN_PROCESS)
    async with agentic(generate) as (rollout, _):
        result = await rollout.run(["Think first", "Say hi"])
    assert len(result.samples) == 2
    assert all(s.session is not None and s.session.tito_mismatches == 0 for s in result.samples)
    assert all(s.status is SampleStatus.COMPLETED and s.reward == 1.0 for s in result.samples)
    thinking = next(s for s in result.samples if s.prompt == "Think first")
    assert thinking.response.count("<think>") == 1
    assert result.metrics["rollout/tito_session_mismatch_rate"] == 0.0


async def test_without_token_in_a_dropped_think_block_splits_and_is_counted(agentic: Open) -> None:
    generate = AgentGenerate(
        agents_plain.two_user_turns, sessions=SessionServerConfig(processes=0, token_in=False)
    )
    async with agentic(generate) as (rollout, _):
        result = await rollout.run(["Think first", "Say hi"])
    thinking = [s for s in result.samples if s.prompt == "Think first"]
    plain = [s for s in result.samples if s.prompt == "Say hi"]
    assert len(thinking) == 2
    assert all(s.session is not None and s.session.tito_mismatches == 1 for s in thinking)
    assert len(plain) == 1 and plain[0].session is not None
    assert plain[0].session.tito_mismatches == 0
    assert all(s.status is SampleStatus.COMPLETED and s.reward == 1.0 for s in result.samples)
    assert result.metrics["rollout/tito_session_mismatch_rate"] == pytest.approx(2 / 3)


async def test_without_an_agent_reward_the_reward_pool_scores_the_samples(agentic: Open) -> None:
    from miles_lite.rewards.text_rewards import math_reward
    from miles_lite.rollout.groups import PromptGroup

    generate = AgentGenerate(agents_plain.run_agent, sessions=IN_PROCESS)
    async with agentic(generate, reward="math", rewards={"math": math_reward}) as (rollout, _):
        result = await rollout.run(
            [PromptGroup(prompt="Box it", label="5"), PromptGroup(prompt="Box it", label="6")]
        )
    assert [s.reward for s in result.samples] == [1.0, 0.0]
    assert all("\\boxed{5}" in s.response for s in result.samples)
