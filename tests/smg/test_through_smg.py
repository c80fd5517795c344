"""Rollouts through a real SGLang router (smg) in front of two stand-in engines.

What is checked is what the engines saw: the bodies they received, which engine served
each session's turns, which rids reached which engine, the aborts that arrived.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.engine.config import (
    EngineClientConfig,
    EngineConfig,
    RetryPolicy,
    RouterConfig,
    SmgConfig,
)
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.errors import EngineError, EngineStatusError
from miles_lite.testing import (
    SmgRouter,
    TextEngineProcess,
    TextEngineProcessGroup,
    TextStandInConfig,
)
from miles_lite.types import SampleStatus
from tests.agentic.agents_plain import chat_client
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio


def through(*, workers: int = 2, attempts: int = 3, health_interval_s: float = 0.5) -> EngineConfig:
    return EngineConfig(
        router=RouterConfig(
            max_inflight_per_engine=64,
            health_interval_s=health_interval_s,
            smg=SmgConfig(min_workers=workers, open_timeout_s=30),
        ),
        client=EngineClientConfig(
            total_timeout_s=60,
            retry=RetryPolicy(max_attempts=attempts, backoff_initial_s=0.2, backoff_max_s=1.0),
        ),
    )


async def stats(engine: TextEngineProcess) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(engine.stats)


@asynccontextmanager
async def opened(url: str, tokenizer: Any, **kwargs: Any) -> AsyncIterator[TextRollout]:
    config = kwargs.pop("config")
    async with TextRollout.open([url], tokenizer=tokenizer, config=config, **kwargs) as rollout:
        yield rollout


async def test_a_text_rollout_goes_through_smg_and_its_bodies_arrive_unchanged(
    smg: SmgRouter, engines: TextEngineProcessGroup, tokenizer: Any
) -> None:
    before = [len((await stats(e))["rids_seen"]) for e in engines.processes]
    # 1/3 is not a 32-bit float, and spaces_between_special_tokens is a key smg drops
    # when it re-serialises bodies (it does not with --disable-retries).
    sampling = TextSamplingParams(max_new_tokens=8, temperature=1 / 3, top_p=1 / 3)
    config = TextRolloutConfig(n_samples_per_prompt=4, sampling=sampling, engines=through())
    prompts = [f"Count to {i}." for i in range(6)]
    async with opened(smg.url, tokenizer, config=config) as rollout:
        assert sorted(rollout.context.router.urls) == sorted(engines.urls)
        result = await rollout.run(prompts)
    samples = result.samples
    assert len(samples) == 24 and not result.failed
    for sample in samples:
        sample.validate()
        assert 0 < sample.response_length <= 8
    seen = [
        (await stats(e))["rids_seen"][n:] for e, n in zip(engines.processes, before, strict=True)
    ]
    # Every rid reached exactly one engine once, and smg used both.
    assert Counter(r for rids in seen for r in rids) == Counter(s.request_id for s in samples)
    assert all(seen)
    body = (await stats(engines.processes[0]))["requests"][-1]
    received = body["sampling_params"]
    assert set(sampling.to_payload()) <= set(received)
    assert "spaces_between_special_tokens" in received
    assert received["temperature"] == received["top_p"] == 1 / 3
    assert "model" not in body and "log_metrics" not in body


async def three_turns(base_url: str, prompt: list[dict[str, Any]], kwargs: dict[str, Any]) -> Any:
    """A plain agent: three chat turns with the OpenAI client."""
    async with chat_client(base_url) as oa:
        messages = list(prompt)
        for turn in range(3):
            answer = await oa.chat.completions.create(model="m", messages=messages, **kwargs)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
            messages.append({"role": "user", "content": f"Go on ({turn})."})
    return 1.0


async def test_every_turn_of_an_agent_session_lands_on_one_engine(
    smg: SmgRouter, engines: TextEngineProcessGroup, tokenizer: Any
) -> None:
    before = [len((await stats(e))["requests"]) for e in engines.processes]
    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        sampling=TextSamplingParams(max_new_tokens=6),
        engines=through(),
    )
    prompts = [[{"role": "user", "content": f"Session {i}: say something."}] for i in range(16)]
    generate = AgentGenerate(three_turns, sessions=IN_PROCESS)
    async with opened(smg.url, tokenizer, config=config, generate=generate) as rollout:
        result = await rollout.run(prompts)
    assert not result.failed and len(result.samples) == 16
    assert all(s.reward == 1.0 and s.response_length > 0 for s in result.samples)
    where: dict[str, set[int]] = {}
    turns: Counter[str] = Counter()
    for index, (engine, n) in enumerate(zip(engines.processes, before, strict=True)):
        for body in (await stats(engine))["requests"][n:]:
            first = body["messages"][0]["content"]
            where.setdefault(first, set()).add(index)
            turns[first] += 1
    assert len(where) == 16 and set(turns.values()) == {3}
    # Each session's turns at one engine (its key's); the sessions over both engines.
    assert all(len(engine) == 1 for engine in where.values()), where
    assert {i for engine in where.values() for i in engine} == {0, 1}


async def test_an_agent_rollout_stopped_early_aborts_its_turns_at_the_engines(
    smg: SmgRouter, engines: TextEngineProcessGroup, tokenizer: Any
) -> None:
    slow = engines.processes[1]
    before = len((await stats(slow))["aborts"])
    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        rollout_batch_size=2,
        over_sampling_batch_size=16,
        sampling=TextSamplingParams(max_new_tokens=48),
        engines=through(),
        abort_all_on_stop=False,  # by rid: each turn's rid at every engine smg lists
    )
    prompts = [[{"role": "user", "content": f"Agent {i}: go."}] for i in range(16)]
    generate = AgentGenerate(three_turns, sessions=IN_PROCESS)
    async with opened(smg.url, tokenizer, config=config, generate=generate) as rollout:
        result = await rollout.run(prompts)
        assert len(result.groups) == 2 and result.partial
        after = await stats(slow)
        assert len(after["aborts"]) > before and after["running"] == 0
        assert generate.server.session_ids() == []


@pytest.mark.parametrize("abort_all", [True, False])
async def test_early_stop_aborts_reach_the_engines_and_partial_samples_resume(
    abort_all: bool, smg: SmgRouter, engines: TextEngineProcessGroup, tokenizer: Any
) -> None:
    # The fast engine finishes the kept groups while the slow one still generates: those
    # requests must be aborted there, by rid or all at once. Every answer runs to its 64
    # tokens (ignore_eos), so the kept groups take at least 128 ms on the fast engine and
    # the slow one has made a token (one each 50 ms) in each aborted request by then: with
    # the stand-in's EOS at 17 tokens they took about 35 ms, and an aborted request could
    # have nothing to keep.
    slow = engines.processes[1]
    before = [len((await stats(e))["aborts"]) for e in engines.processes]
    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        rollout_batch_size=2,
        over_sampling_batch_size=16,
        sampling=TextSamplingParams(max_new_tokens=64, extra={"ignore_eos": True}),
        engines=through(),
        abort_all_on_stop=abort_all,
        stop_timeout_s=10,
    )
    async with opened(smg.url, tokenizer, config=config) as rollout:
        result = await rollout.run([f"Tell story {i}." for i in range(16)])
        aborted = [s for g in result.partial for s in g if s.status is SampleStatus.ABORTED]
        assert len(result.groups) == 2 and aborted
        fast_aborts, slow_aborts = [
            (await stats(e))["aborts"][n:] for e, n in zip(engines.processes, before, strict=True)
        ]
        assert slow_aborts and (await stats(slow))["running"] == 0
        if abort_all:
            assert any(a.get("abort_all") for a in slow_aborts)
        else:
            # Per rid, each sent to every engine smg lists (it chose which one).
            rids = {a.get("rid") for a in slow_aborts} & {a.get("rid") for a in fast_aborts}
            assert {s.request_id for s in aborted if s.request_id} <= rids
        # Partial output kept, then resumed in the next run (partial rollout).
        assert any(s.response_length > 0 for s in aborted)
        carried = {id(s): s.response_length for g in result.partial[:2] for s in g}
        resumed = await rollout.run(result.partial[:2])
    assert len(resumed.samples) == 2
    for sample in resumed.samples:
        assert sample.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
        assert carried[id(sample)] <= sample.response_length <= 64
        sample.validate()


async def test_an_engine_killed_mid_rollout_fails_its_requests_and_none_runs_twice(
    tokenizer: Any,
) -> None:
    group = TextEngineProcessGroup([TextStandInConfig(token_latency_s=0.02)] * 2)
    victim, survivor = group.processes
    config = TextRolloutConfig(
        n_samples_per_prompt=1,
        sampling=TextSamplingParams(max_new_tokens=40),
        engines=through(attempts=4),
    )
    snapshot: list[str] = []

    async def kill_when_busy() -> None:
        with anyio.fail_after(60):
            while (await stats(victim))["running"] < 2:  # noqa: ASYNC110 (another process)
                await anyio.sleep(0.02)
        snapshot.extend((await stats(victim))["rids_seen"])
        os.kill(victim.pid or 0, signal.SIGKILL)

    async with group, SmgRouter(group.urls, flags=SMG_FLAGS) as smg:
        async with (
            opened(smg.url, tokenizer, config=config) as rollout,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(kill_when_busy)
            result = await rollout.run([f"Write line {i}." for i in range(24)])
        survivor_rids = (await stats(survivor))["rids_seen"]
    samples = result.samples
    done = [s for s in samples if s.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)]
    failed = result.failed
    assert len(done) + len(failed) == 24 and done and failed
    # What the victim had received before it died never reached the survivor, and no rid
    # reached the survivor twice: miles_lite sent no generation again.
    assert snapshot and not set(snapshot) & set(survivor_rids)
    assert len(survivor_rids) == len(set(survivor_rids))
    for sample in failed:
        assert isinstance(sample.error, EngineError), sample.error
        assert sample.error.request_id not in survivor_rids
    # The requests the victim held when it died: smg's call_upstream_request_error, not
    # retryable (the engine had them).
    lost = [s.error for s in failed if "call_upstream_request_error" in str(s.error)]
    assert lost and all(isinstance(e, EngineStatusError) and not e.retryable for e in lost)
    for sample in done:
        sample.validate()


async def test_control_and_diffusion_paths_are_not_smgs(
    smg: SmgRouter, engines: TextEngineProcessGroup
) -> None:
    # Why aborts go to the engines, and diffusion stays on engine URLs.
    async with EngineClient(EngineClientConfig(retry=RetryPolicy(max_attempts=1))) as client:
        for path in ("/abort_request", "/pause_generation", "/rollout/generate"):
            with pytest.raises(EngineStatusError) as caught:
                await client.post_json(smg.url, path, {"rid": "r"})
            assert caught.value.status == 404 and "unknown_url" in str(caught.value)
            assert not caught.value.retryable


async def test_with_its_retries_on_smg_rewrites_generate_bodies(
    engines: TextEngineProcessGroup,
) -> None:
    # Why smg_launch_args has --disable-retries: to be able to re-send a body, smg parses
    # and re-serialises it, dropping keys and rounding floats.
    body = {
        "input_ids": [1, 2, 3],
        "rid": "rewritten",
        "sampling_params": {
            "max_new_tokens": 2,
            "top_p": 1 / 3,
            "spaces_between_special_tokens": False,
        },
    }
    async with (
        # smg with its default retries on: what miles_lite must not run behind.
        SmgRouter(engines.urls, flags=[f for f in SMG_FLAGS if f != "--disable-retries"]) as smg,
        EngineClient(EngineClientConfig(retry=RetryPolicy(max_attempts=1))) as client,
    ):
        await client.post_json(smg.url, "/generate", body, retry=False)
    received = [
        r
        for e in engines.processes
        for r in (await stats(e))["requests"]
        if r.get("rid") == "rewritten"
    ]
    assert len(received) == 1
    params = received[0]["sampling_params"]
    assert "spaces_between_special_tokens" not in params and params["top_p"] != 1 / 3
    assert received[0].get("model") == "unknown"


async def test_a_weight_update_through_smg_goes_to_every_engine_behind_it(
    smg: SmgRouter, engines: TextEngineProcessGroup, tokenizer: Any
) -> None:
    # Last in the module: the engines keep the version. smg answers 404 to control
    # paths, so pauses, the version bump and the version reads go to the engines it lists.
    config = TextRolloutConfig(
        n_samples_per_prompt=2,
        sampling=TextSamplingParams(max_new_tokens=8),
        engines=through(),
    )
    aborts = [len((await stats(e))["aborts"]) for e in engines.processes]
    async with opened(smg.url, tokenizer, config=config) as rollout:
        report = await rollout.update_weights(None, version="smg-7")
        result = await rollout.run(["Count to 3."])
        router = rollout.context.router
        async with EngineClient(EngineClientConfig()) as client:
            infos = [await client.get_json(url, "/model_info") for url in engines.urls]
    assert report.ok and report.push.action == "update_weight_version"
    assert sorted(e.url for e in report.push.engines) == sorted(engines.urls)
    assert [info["weight_version"] for info in infos] == ["smg-7", "smg-7"]
    assert router.versions.current == "smg-7"
    assert all(s.weight_versions == ["smg-7"] for s in result.samples)
    # The bump never aborts (abort_all_requests false), and nothing else did either.
    assert [len((await stats(e))["aborts"]) for e in engines.processes] == aborts
