"""The harness around the stand-ins: the generic child process, statistics snapshots,
the text stand-in's scheduler, and the two kinds of error (ValueError, StandInError)."""

from __future__ import annotations

import dataclasses
import urllib.error

import aiohttp
import anyio
import pytest

from miles_lite.testing import (
    ChildProcess,
    EngineStatistics,
    ProcessGroup,
    StandInConfig,
    StandInEngine,
    StandInError,
    TextEngineProcessGroup,
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TinyModelPolicy,
)
from miles_lite.testing.text.scheduler import Call, Scheduler
from miles_lite.testing.text.stats import TextEngineStats
from tests.testing.replies import post


def test_a_child_process_runs_any_engine_factory_with_its_config() -> None:
    child = ChildProcess(StandInEngine, StandInConfig(wire="json"), start_timeout_s=30)
    with ProcessGroup([child]) as group:
        assert group.urls == [child.url]
        assert child.call_json("/server_info")["wire"] == "json"
        assert child.call_json("/_stand_in/faults", {"unhealthy": True})["unhealthy"] is True
        with pytest.raises(urllib.error.HTTPError):
            child.call_json("/_stand_in/faults", {"bogus": 1})
        assert not hasattr(child, "set_faults")  # only the diffusion process class has it
    assert not child.is_alive()
    with pytest.raises(StandInError, match="already stopped"):
        child.start()
    with pytest.raises(RuntimeError, match="url"):
        _ = ChildProcess(StandInEngine, StandInConfig()).url


def test_bad_harness_arguments_are_value_errors_naming_field_and_value() -> None:
    with pytest.raises(ValueError, match=r"stop_timeout_s .*-1"):
        ChildProcess(StandInEngine, StandInConfig(), stop_timeout_s=-1)
    with pytest.raises(ValueError, match="at least one process"):
        ProcessGroup([])
    with pytest.raises(ValueError, match="configs"):
        TextEngineProcessGroup([])
    for build, named in (
        (lambda: TextStandInConfig(token_latency_s=-1), "token_latency_s"),
        (lambda: TextStandInConfig(policy="script"), "policy"),  # type: ignore[arg-type]
        (lambda: TextRule("(", "x"), "pattern"),
        (lambda: TextPolicy(default_length=-1), "default_length"),
        (lambda: TinyModelPolicy(num_layers=-2), "num_layers"),
    ):
        with pytest.raises(ValueError, match=named):
            build()


@pytest.mark.anyio
async def test_diffusion_statistics_are_a_frozen_snapshot(session: aiohttp.ClientSession) -> None:
    async with StandInEngine(StandInConfig()) as engine:
        before = engine.statistics()
        reply = await post(session, engine.url, {"prompt": "x", "seed": 1})
        assert reply.status == 200
        after = engine.statistics()
    assert isinstance(before, EngineStatistics)
    assert (before.requests_received, before.requests) == (0, ())
    assert (after.requests_received, after.requests_served, after.samples_served) == (1, 1, 1)
    assert after.requests == ({"prompt": "x", "seed": 1},)
    assert after.bytes_served == engine.stats.bytes_served > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.requests_served = 2  # type: ignore[misc]
    engine.stats.reset()
    assert after.requests_served == 1  # a snapshot does not follow the live stats


@pytest.mark.anyio
async def test_the_scheduler_holds_slots_pauses_and_aborts() -> None:
    stats = TextEngineStats()
    scheduler = Scheduler(max_running=1, token_latency_s=0.0, stats=stats)
    with pytest.raises(RuntimeError, match="before start"):
        scheduler.pause("abort")
    scheduler.start()
    with pytest.raises(ValueError, match="'sideways'"):
        scheduler.pause("sideways")
    first, second = Call("req-1"), Call("req-2")
    release = anyio.Event()
    finishes: dict[str, dict[str, object]] = {}

    async def generate(call: Call) -> None:
        async def work() -> dict[str, object]:
            await release.wait()
            return {"type": "length"} if await scheduler.pace(call) else {"type": "abort"}

        finishes[call.rid] = await scheduler.run(call, work)

    async with anyio.create_task_group() as tg:
        tg.start_soon(generate, first)
        tg.start_soon(generate, second)
        await anyio.wait_all_tasks_blocked()
        assert (stats.running, stats.waiting, stats.max_running_seen) == (1, 1, 1)
        scheduler.pause("in_place")
        assert scheduler.paused
        assert scheduler.abort("req-2") == 1  # the waiting one leaves the queue at once
        await anyio.wait_all_tasks_blocked()
        assert finishes["req-2"]["type"] == "abort" and stats.waiting == 0
        release.set()
        await anyio.wait_all_tasks_blocked()
        assert "req-1" not in finishes  # held by the pause
        scheduler.resume()
    assert finishes["req-1"] == {"type": "length"}
    assert not scheduler.paused and stats.running == 0


@pytest.mark.anyio
async def test_a_pause_that_lands_during_a_tokens_pacing_holds_that_token() -> None:
    # A pause, weight update and continue can land while a request sleeps out its token
    # latency: the token must wait for the continue, so that the retract check after
    # pace() sees the flush (else the next tokens run on KV from the old weights).
    scheduler = Scheduler(max_running=1, token_latency_s=0.05, stats=TextEngineStats())
    scheduler.start()
    call = Call("req-1")
    paced: list[bool] = []

    async def one_token() -> None:
        paced.append(await scheduler.pace(call))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one_token)
        await anyio.wait_all_tasks_blocked()  # in its latency sleep
        scheduler.pause("retract")
        await anyio.sleep(0.2)  # the sleep is over, the pause is not
        assert paced == []
        scheduler.resume()
    assert paced == [True]
