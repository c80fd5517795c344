"""TextRollout end to end over loopback stand-in engines: single turn, oversampling, abort."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from miles_lite import AgentGenerate, GenerateError, SampleStatus, TextRollout, TextSamplingParams
from miles_lite.errors import (
    ConfigError,
    EngineStatusError,
    RolloutWarning,
    SamplingParamsError,
)
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.rollout.filters import drop_zero_std
from miles_lite.testing import TextPolicy, TextStandInConfig, token_logprob
from tests.agentic import agents_plain
from tests.support.sessions import IN_PROCESS
from tests.text.conftest import RULES, OpenRollout

pytestmark = pytest.mark.anyio


async def test_single_turn_samples_hold_the_engines_tokens_and_log_probs(
    text_rollout: OpenRollout, tokenizer: Any
) -> None:
    prompts = ["What is 2+3?", [{"role": "user", "content": "What is 2+3?"}]]
    async with text_rollout(engines=2, n_samples_per_prompt=3) as (rollout, engines):
        result = await rollout.run(prompts)
    assert [len(g) for g in result.groups] == [3, 3]
    requests = [r for e in engines for r in e.stats.requests]
    assert len(requests) == 6 and all(e.stats.requests for e in engines)
    rids = {r["rid"] for r in requests}
    assert len(rids) == 6 and all(len(rid) == 32 for rid in rids)
    for request in requests:
        assert request["return_logprob"] is True and "logprob_start_len" not in request
        assert request["sampling_params"]["max_new_tokens"] == 32
    chat_ids = tokenizer.apply_chat_template(prompts[1], add_generation_prompt=True, tokenize=True)
    chat_ids = chat_ids if isinstance(chat_ids, list) else list(chat_ids["input_ids"])
    for sample in result.samples:
        sample.validate()
        assert sample.status is SampleStatus.COMPLETED
        assert "\\boxed{5}" in sample.response
        out = sample.tokens[len(sample.tokens) - sample.response_length :]
        assert sample.rollout_log_probs == [token_logprob(i, t) for i, t in enumerate(out)]
        assert sample.loss_mask == [1] * sample.response_length
        assert sample.weight_versions == ["default"]
    assert result.groups[1][0].tokens[: len(chat_ids)] == chat_ids
    assert result.metrics["rollout/response_len/mean"] > 0
    assert result.metrics["rollout/truncated_ratio"] == 0.0


async def test_oversampling_keeps_the_target_aborts_the_rest_and_a_second_run_resumes(
    text_rollout: OpenRollout, tokenizer: Any
) -> None:
    slow = TextStandInConfig(
        token_latency_s=0.005, policy=TextPolicy(rules=RULES, default_length=400)
    )
    async with text_rollout(
        engine_config=slow,
        max_new_tokens=300,
        n_samples_per_prompt=2,
        rollout_batch_size=1,
        over_sampling_batch_size=4,
    ) as (rollout, (engine,)):
        # Prompt 0 answers at once (a short scripted answer); the others take ~1.5 s.
        prompts = ["What is 2+3?", "slow one", "slow two", "slow three"]
        first = await rollout.run(prompts)
        assert len(first.groups) == 1 and first.groups[0][0].prompt == "What is 2+3?"
        assert first.metrics["perf/stop_time"] < 3.0
        assert engine.stats.running == engine.stats.waiting == 0  # nothing left running
        assert any(body.get("abort_all") for body in engine.stats.aborts)
        partial = [s for g in first.partial for s in g]
        assert len(partial) == 6
        assert all(s.status is SampleStatus.ABORTED for s in partial), [
            (s.status, s.response_length, s.error) for s in partial
        ]
        assert all(0 < s.response_length < 300 for s in partial)
        assert all(s.reward is None for s in partial)  # no reward for unneeded work
        done_before = {(s.prompt, s.seed) for s in partial}
        sent_before = len(engine.stats.requests)
        # All of them this time: a rollout on the same engines without oversampling.
        everything = dataclasses.replace(
            rollout.config, rollout_batch_size=None, over_sampling_batch_size=None
        )
        resume = TextRollout(config=everything, router=rollout.context.router, tokenizer=tokenizer)
        second = await resume.run(first.partial)
    resumed = second.samples
    assert len(resumed) == 6 and all(s.status is SampleStatus.TRUNCATED for s in resumed)
    assert all(s.response_length == 300 for s in resumed)  # the budget, not 300 more
    for body in engine.stats.requests[sent_before:]:
        budget = body["sampling_params"]["max_new_tokens"]
        assert budget < 300 and budget + len(body["input_ids"]) >= 300
    assert {(s.prompt, s.seed) for s in resumed} == done_before
    assert [s.index for s in resumed] == list(range(6))  # numbered for this rollout
    for sample in resumed:
        sample.validate()


async def test_without_abort_all_each_rid_is_aborted_at_the_engine_that_holds_it(
    text_rollout: OpenRollout,
) -> None:
    slow = TextStandInConfig(
        token_latency_s=0.005, policy=TextPolicy(rules=RULES, default_length=400)
    )
    async with text_rollout(
        engines=2,
        engine_config=slow,
        max_new_tokens=300,
        n_samples_per_prompt=2,
        rollout_batch_size=1,
        over_sampling_batch_size=4,
        abort_all_on_stop=False,
    ) as (rollout, engines):
        result = await rollout.run(["What is 2+3?", "slow one", "slow two", "slow three"])
    assert len(result.groups) == 1
    aborted = {s.request_id for g in result.partial for s in g}
    sent_to = [set(engine.stats.rids_seen) for engine in engines]
    assert all(sent_to), "both engines generated"
    seen_aborts: set[str] = set()
    for engine, rids in zip(engines, sent_to, strict=True):
        bodies = engine.stats.aborts
        assert not any(body.get("abort_all") for body in bodies)
        asked = {body["rid"] for body in bodies}
        assert asked and asked <= rids  # its own rids only, never another engine's
        seen_aborts |= asked
    assert aborted <= seen_aborts


async def test_weight_versions_are_recorded_per_sample(text_rollout: OpenRollout) -> None:
    async with text_rollout() as (rollout, (engine,)):
        before = await rollout.run(["What is 2+3?"])
        await rollout.context.router.client.post_json(
            engine.url, "/update_weight_version", {"new_version": "step-7"}
        )
        after = await rollout.run(["What is 2+3?"])
    assert {v for s in before.samples for v in s.weight_versions} == {"default"}
    assert {v for s in after.samples for v in s.weight_versions} == {"step-7"}


async def test_bad_input_fails_its_sample_and_the_rest_goes_on(
    text_rollout: OpenRollout,
) -> None:
    async with text_rollout(max_context_len=64, n_samples_per_prompt=1) as (rollout, (engine,)):
        result = await rollout.run(["What is 2+3?", "word " * 200])
    ok, long = result.samples
    assert ok.status is SampleStatus.COMPLETED
    assert long.status is SampleStatus.TRUNCATED
    assert long.status_reason == "prompt_too_long"
    assert len(engine.stats.requests) == 1  # the long prompt was never sent

    with pytest.raises(SamplingParamsError, match=r"max_tokens.*max_new_tokens"):
        TextSamplingParams(extra={"max_tokens": 8})


async def test_an_engine_400_surfaces_with_sglangs_message(text_rollout: OpenRollout) -> None:
    async def bad_key(input: GenerateFnInput) -> Any:
        # Bypass the library's check, as a custom function might: SGLang refuses.
        from miles_lite.text.request import post_generate

        payload = {"input_ids": [1, 2], "sampling_params": {"bogus": 1}, "rid": "r" * 32}
        return await post_generate(input.context, input.run, payload)

    def raises(input: GenerateFnInput) -> Any:
        raise ZeroDivisionError("custom bug")

    async with text_rollout(generate=bad_key, n_samples_per_prompt=1) as (rollout, _):
        result = await rollout.run(["x"])
    (sample,) = result.samples
    assert isinstance(sample.error, EngineStatusError) and sample.error.status == 400
    assert "unknown field `bogus`" in str(sample.error)

    async def broken(input: GenerateFnInput) -> Any:
        return raises(input)

    async with text_rollout(generate=broken, n_samples_per_prompt=2) as (rollout, _):
        result = await rollout.run(["x"])
    for sample in result.samples:
        assert isinstance(sample.error, GenerateError)
        assert isinstance(sample.error.__cause__, ZeroDivisionError)
        assert sample.error.__cause__.__traceback__ is not None


async def test_a_custom_functions_samples_are_validated_the_defaults_are_valid_as_made(
    text_rollout: OpenRollout, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from miles_lite.errors import SampleInvariantError
    from miles_lite.text import single_turn

    async def off_by_one(input: GenerateFnInput) -> Any:
        # A custom function on top of the default one, with a bug: a token that is no id.
        sample = await single_turn.generate(input)
        if sample.index % 2:
            sample.tokens.append(-5)
        return sample

    async with text_rollout(generate=off_by_one, n_samples_per_prompt=4) as (rollout, _):
        result = await rollout.run(["What is 2+3?"])
    for sample in result.samples:
        if sample.index % 2:
            assert sample.status is SampleStatus.FAILED
            assert isinstance(sample.error, SampleInvariantError)
            assert f"tokens[{len(sample.tokens) - 1}] is -5" in str(sample.error)
        else:
            assert sample.status is SampleStatus.COMPLETED
            sample.validate(vocab_size=len(tokenizer))

    # The default function's samples are not validated again, and need not be.
    from miles_lite.types import Sample

    validated: list[int] = []
    check = Sample.validate
    monkeypatch.setattr(Sample, "validate", lambda s, **kw: validated.append(s.index))
    async with text_rollout(n_samples_per_prompt=4) as (rollout, _):
        result = await rollout.run(["What is 2+3?", "And 3+4?"])
    assert validated == []
    monkeypatch.setattr(Sample, "validate", check)
    for sample in result.samples:
        assert sample.status is SampleStatus.COMPLETED
        sample.validate(vocab_size=len(tokenizer))


async def test_a_filter_drops_groups_whose_rewards_agree(text_rollout: OpenRollout) -> None:
    from miles_lite.rewards.text_rewards import math_reward

    async with text_rollout(
        n_samples_per_prompt=2,
        reward="math",
        rewards={"math": math_reward},
        dynamic_filter=drop_zero_std(),
    ) as (rollout, _):
        from miles_lite.rollout.groups import PromptGroup

        with pytest.warns(RolloutWarning, match=r"kept 0 of 2 groups; filtered 2"):
            result = await rollout.run(
                [
                    PromptGroup(prompt="What is 2+3?", label="5"),
                    PromptGroup(prompt="What is 2+3?", label="6"),
                ]
            )
    assert result.groups == []
    assert result.filter_reasons == ["drop_zero_std_1.0", "drop_zero_std_0.0"]
    assert all(s.reward in (0.0, 1.0) for g in result.filtered for s in g)


async def test_tokenizing_long_prompts_never_stalls_the_loop(text_rollout: OpenRollout) -> None:
    # Each prompt takes 0.4-0.7 s to tokenize here: on the loop, the suite's loop guard
    # (steps over 250 ms fail the test) would catch it. Too long for the context, they
    # are never sent.
    long = "The quick brown fox jumps over the lazy dog. " * 20000
    prompts = [long, [{"role": "user", "content": long}]]
    async with text_rollout(max_context_len=1024, n_samples_per_prompt=1) as (rollout, (engine,)):
        result = await rollout.run(prompts)
    assert [s.status_reason for s in result.samples] == ["prompt_too_long"] * 2
    assert engine.stats.requests == []


async def test_open_starts_a_session_server_for_an_agentic_generate_function(
    text_rollout: OpenRollout,
) -> None:
    agent = AgentGenerate(agents_plain.run_agent, sessions=IN_PROCESS)
    async with text_rollout(generate=agent, n_samples_per_prompt=2) as (rollout, _):
        result = await rollout.run([[{"role": "user", "content": "What is 2+3?"}]])
        assert agent.server.session_ids() == []  # every session closed
    with pytest.raises(ConfigError, match="no session server"):  # stopped with the rollout
        _ = agent.server
    assert [s.status for s in result.samples] == [SampleStatus.COMPLETED] * 2
    for sample in result.samples:
        sample.validate()
        assert sample.response_length > 0 and sample.loss_mask == [1] * sample.response_length


async def test_two_runs_at_once_on_one_rollout_stop_only_their_own_requests(
    text_rollout: OpenRollout,
) -> None:
    # Per-run state: run A stops early (its target is kept) while run B still generates.
    # A's stop aborts A's requests, each at its engine, and not everything (B would lose
    # its work); B then ends as if alone.
    slow = TextStandInConfig(
        token_latency_s=0.005, policy=TextPolicy(rules=RULES, default_length=400)
    )
    async with text_rollout(
        engine_config=slow,
        max_new_tokens=200,
        n_samples_per_prompt=1,
        rollout_batch_size=1,
        over_sampling_batch_size=3,
    ) as (rollout, (engine,)):
        results: dict[str, Any] = {}

        async def run(name: str, prompts: list[str]) -> None:
            results[name] = await rollout.run(prompts)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "b", ["slow one"])
            await anyio.sleep(0.05)  # B's request is at the engine
            tg.start_soon(run, "a", ["What is 2+3?", "slow two", "slow three"])
    a, b = results["a"], results["b"]
    assert a.rollout_id != b.rollout_id
    assert [g[0].prompt for g in a.groups] == ["What is 2+3?"]
    a_aborted = {s.request_id for g in a.partial for s in g}
    assert all(s.status is SampleStatus.ABORTED for g in a.partial for s in g)
    # Only A's rids were aborted while B ran: no abort_all, no rid of B.
    assert engine.stats.aborts and not any(body.get("abort_all") for body in engine.stats.aborts)
    assert {body["rid"] for body in engine.stats.aborts} <= a_aborted
    (b_sample,) = b.samples
    assert b_sample.status is SampleStatus.TRUNCATED and b_sample.response_length == 200
    assert b_sample.request_id not in a_aborted


async def test_a_bad_answer_fails_its_sample_before_anything_of_it_is_kept(
    tokenizer: Any, captures: Any
) -> None:
    # A misbehaving engine: a None log-prob (once read as 0.0, probability 1), then a
    # cached_tokens that is not a count (once failing the sample after its output was
    # appended). Neither becomes training data; the sample holds only its prompt.
    import json

    from miles_lite import TextRolloutConfig
    from miles_lite.engine.config import EngineConfig, RouterConfig
    from miles_lite.errors import EngineProtocolError
    from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine

    good = json.loads((captures / "gen_stop.json").read_text())
    del good["meta_info"]["id"]  # a canned answer cannot echo each request's rid
    none_log_prob = json.loads(json.dumps(good))
    none_log_prob["meta_info"]["output_token_logprobs"][1][0] = None
    bad_count = json.loads(json.dumps(good))
    bad_count["meta_info"]["cached_tokens"] = "1"
    engine = ScriptedEngine()
    runner = await start_engine(engine)
    try:
        for body in (none_log_prob, bad_count):
            engine.script("/generate", Reply(200, json.dumps(body).encode(), "application/json"))
        config = TextRolloutConfig(
            n_samples_per_prompt=1,
            sampling=TextSamplingParams(max_new_tokens=3),
            engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=1)),
        )
        async with TextRollout.open([engine.url], tokenizer=tokenizer, config=config) as rollout:
            result = await rollout.run(["What is 2+3?", "And 3+4?"])
    finally:
        await runner.cleanup()
    prompt_ids = [
        tokenizer.encode(p, add_special_tokens=False) for p in ("What is 2+3?", "And 3+4?")
    ]
    for sample, field, ids in zip(
        result.samples, ("log-prob is None", "cached_tokens"), prompt_ids, strict=True
    ):
        assert sample.status is SampleStatus.FAILED
        assert isinstance(sample.error, EngineProtocolError) and field in str(sample.error)
        assert sample.error.url == engine.url and sample.error.request_id
        assert (sample.tokens, sample.response_length, sample.loss_mask) == (ids, 0, None)
