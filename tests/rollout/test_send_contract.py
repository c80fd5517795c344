"""The one send path's contract, run over every caller: ``/generate`` requests
(``post_generate``) and chat turns (the session server), against a text stand-in on
loopback.

After a weight update every request carries the new version's cache key; a request that
crossed an update has version spans and ``kv_version`` marks; a stop aborts both alike at
their engine; a request still waiting for an engine slot at the stop (or, for a chat
turn, at its session's abort: issue 30 D1) is never sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite.agentic.config import Session
from miles_lite.agentic.server import SessionServer
from miles_lite.diffusion.config import DiffusionSamplingParams, TransportMode
from miles_lite.diffusion.context import DiffusionContext
from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.control import abort_requests
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.sglang.control import PauseMode
from miles_lite.sglang.generate_wire import build_generate_payload, new_rid
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.testing import (
    StandInConfig,
    StandInEngine,
    TextPolicy,
    TextStandInConfig,
    TextStandInEngine,
)
from miles_lite.text.context import TextContext
from miles_lite.text.request import post_generate
from miles_lite.types import Sample, SampleStatus, WeightSpan
from tests.support.polling import wait_until
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio

#: Long answers (40 tokens at 10 ms): an update or a stop lands while they run.
SLOW = TextStandInConfig(policy=TextPolicy(default_length=40), token_latency_s=0.01)
KEY_1 = "miles-lite-weights:1"


@dataclass
class Stack:
    """One stand-in, its router, a text context, a session server over it, a run."""

    engine: TextStandInEngine
    router: Router
    context: TextContext
    server: SessionServer
    run: RunContext
    http: aiohttp.ClientSession


@asynccontextmanager
async def open_stack(tokenizer: Any, *, slots: int = 8) -> AsyncIterator[Stack]:
    async with (
        TextStandInEngine(SLOW, tokenizer) as engine,
        EngineClient(EngineClientConfig(total_timeout_s=30.0)) as client,
        Router([engine.url], client, RouterConfig(max_inflight_per_engine=slots)) as router,
    ):
        sampling = TextSamplingParams(max_new_tokens=40, extra={"ignore_eos": True})
        context = TextContext(tokenizer, router, sampling, vocab_size=len(tokenizer))
        async with SessionServer(context, IN_PROCESS) as server, aiohttp.ClientSession() as http:
            yield Stack(engine, router, context, server, RunContext(0), http)


async def generate(stack: Stack, rid: str) -> tuple[str, tuple[WeightSpan, ...]] | None:
    """One /generate request: (finish reason, version spans), None if never sent."""
    payload = build_generate_payload([1, 2, 3], {"max_new_tokens": 40, "ignore_eos": True}, rid=rid)
    answer = await post_generate(stack.context, stack.run, payload)
    return None if answer is None else (answer.finish_reason, answer.weight_spans)


async def chat(stack: Stack, session: Session) -> tuple[str, tuple[WeightSpan, ...]] | None:
    """One chat turn on ``session``: (finish reason, the recorded turn's version spans),
    None when it was answered ``abort`` without being recorded."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Count with me"}]}
    async with stack.http.post(f"{session.base_url}/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    records = stack.server.records(session.id)
    finish = answer["choices"][0]["finish_reason"]
    if not records:
        assert finish == "abort"
        return None
    return finish, records[-1].weight_spans


def sent_bodies(stack: Stack) -> list[dict[str, Any]]:
    return list(stack.engine.statistics().requests)


async def test_after_an_update_every_request_carries_the_new_cache_key(tokenizer: Any) -> None:
    async with open_stack(tokenizer) as stack:
        session = await stack.server.open_session(stack.run)
        assert await generate(stack, new_rid()) is not None
        assert await chat(stack, session) is not None
        before = len(sent_bodies(stack))
        report = await stack.router.update_weights(None, version="1")
        assert report.ok
        for _ in range(2):
            assert await generate(stack, new_rid()) is not None
            assert await chat(stack, session) is not None
    bodies = sent_bodies(stack)
    assert before == 2 and len(bodies) == 6
    assert [("extra_key" in b) for b in bodies[:before]] == [False, False]
    assert [b.get("extra_key") for b in bodies[before:]] == [KEY_1] * 4
    assert sum("sampling_params" in b for b in bodies) == 3  # /generate
    assert sum("messages" in b for b in bodies) == 3  # chat turns


Caller = Callable[[Stack, Any], Awaitable[tuple[str, tuple[WeightSpan, ...]] | None]]


async def _generate_caller(stack: Stack, _: Any) -> tuple[str, tuple[WeightSpan, ...]] | None:
    return await generate(stack, new_rid())


CALLERS: dict[str, Caller] = {"generate": _generate_caller, "chat": chat}


@pytest.mark.parametrize("caller", ["generate", "chat"])
async def test_a_request_across_an_in_place_update_has_spans_and_kv_marks(
    tokenizer: Any, caller: str
) -> None:
    async with open_stack(tokenizer) as stack:
        session = await stack.server.open_session(stack.run)
        got: list[Any] = []

        async def send() -> None:
            got.append(await CALLERS[caller](stack, session))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            await wait_until(lambda: stack.engine.stats.generated_tokens >= 5)
            config = WeightUpdateConfig(mode=PauseMode.IN_PLACE)
            report = await stack.router.update_weights(None, version="1", config=config)
            assert report.ok and report.kept_kv
    ((finish, spans),) = got
    assert finish == "length"
    first, second = spans
    assert (first.version, first.kv_version) == ("default", None)
    # Made by version 1 on the KV version "default" computed: marked, as on /generate.
    assert (second.version, second.kv_version) == ("1", "default")
    assert second.end == 40


@pytest.mark.parametrize("caller", ["generate", "chat"])
async def test_a_stop_aborts_requests_in_flight_at_their_engine_alike(
    tokenizer: Any, caller: str
) -> None:
    async with open_stack(tokenizer) as stack:
        session = await stack.server.open_session(stack.run)
        got: list[Any] = []

        async def send() -> None:
            got.append(await CALLERS[caller](stack, session))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            await wait_until(lambda: stack.engine.stats.generated_tokens >= 3)
            by_engine = stack.router.abort_targets(stack.run.in_flight.by_engine())
            assert [len(rids) for rids in by_engine.values()] == [1]
            assert list(by_engine) == [stack.engine.url]
            stack.run.stop.set()
            report = await abort_requests(stack.router.client, by_engine, timeout_s=2.0)
            assert all(engine.idle for engine in report.engines)
        ((finish, spans),) = got
        assert finish == "abort"
        assert 0 < spans[-1].end < 40  # partial output, stopped at the engine
        assert len(stack.run.in_flight) == 0
        assert [body.get("rid") for body in stack.engine.stats.aborts] == next(
            iter(by_engine.values())
        )


@pytest.mark.parametrize("stop", ["run-stop", "session-abort"])
async def test_a_request_waiting_for_a_slot_at_the_stop_is_never_sent(
    tokenizer: Any, stop: str
) -> None:
    async with open_stack(tokenizer, slots=1) as stack:
        session = await stack.server.open_session(stack.run)
        rid = new_rid()
        got: dict[str, Any] = {}

        async def send_generate() -> None:
            got["generate"] = await generate(stack, rid)

        async def send_chat() -> None:
            got["chat"] = await chat(stack, session)

        async with anyio.create_task_group() as tg, stack.router.lease():  # the only slot
            if stop == "run-stop":
                tg.start_soon(send_generate)
            tg.start_soon(send_chat)
            waiting = 2 if stop == "run-stop" else 1
            await wait_until(lambda: len(stack.run.in_flight) == waiting)
            await anyio.sleep(0.05)  # at the lease, waiting for the slot
            if stop == "run-stop":
                stack.run.stop.set()
            else:  # issue 30 D1: the session is aborted, its run goes on
                await stack.server.abort([session.id])
        # Both were answered without reaching the engine; nothing was recorded.
        assert got == ({"generate": None, "chat": None} if stop == "run-stop" else {"chat": None})
        assert stack.engine.statistics().requests == ()
        assert stack.server.records(session.id) == []
        assert stack.server.statistics().aborted_answers == 1
        assert len(stack.run.in_flight) == 0


async def test_a_diffusion_microgroup_waiting_for_a_slot_at_the_stop_is_never_sent() -> None:
    async with (
        StandInEngine(StandInConfig(step_latency_s=0.005)) as engine,
        EngineClient(EngineClientConfig(total_timeout_s=30.0)) as client,
        Router([engine.url], client, RouterConfig(max_inflight_per_engine=1)) as router,
    ):
        run = RunContext(0)
        samples = [Sample(prompt="a cat", index=i, seed=7 + i) for i in range(2)]
        got: list[list[Sample]] = []
        context = DiffusionContext(router=router, mode=TransportMode.INLINE)
        fn_input = GenerateFnInput(
            samples=samples,
            sampling_params=DiffusionSamplingParams().to_payload(),
            context=context,
            run=run,
        )

        async def send() -> None:
            got.append(await generate_diffusion(fn_input))

        async with anyio.create_task_group() as tg, router.lease():  # the only slot
            tg.start_soon(send)
            await wait_until(lambda: len(run.in_flight) == 1)
            await anyio.sleep(0.05)  # at the lease, waiting for the slot
            run.stop.set()
        assert [s.status for s in got[0]] == [SampleStatus.ABORTED] * 2
        assert {s.status_reason for s in got[0]} == {"early_stop"}
        assert len(engine.stats.requests) == 0 and len(run.in_flight) == 0
