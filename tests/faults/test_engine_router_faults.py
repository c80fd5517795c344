"""Engine faults met through the router (issue 11): shared bound, all engines down, a kill
mid-rollout, request ids in errors. Real loopback servers, nothing of the router mocked."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineError, EngineUnavailableError
from miles_lite.testing import StandInConfig, StandInEngine
from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)


def free_url() -> str:
    """A URL of 127.0.0.1 where nothing listens: a dead engine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    async with EngineClient(EngineClientConfig(retry=FAST_RETRY)) as engine_client:
        yield engine_client


async def test_two_concurrent_rollouts_never_exceed_the_engines_bound(
    client: EngineClient,
) -> None:
    # The stand-in admits far more than the bound: what it sees at once is what was sent.
    engine_config = StandInConfig(wire="json", step_latency_s=0.01, max_concurrent=64)
    async with (
        StandInEngine(engine_config) as engine,
        Router([engine.url], client, RouterConfig(max_inflight_per_engine=3)) as router,
    ):

        async def rollout(name: str) -> None:
            async with anyio.create_task_group() as tg:
                for i in range(12):
                    body = {"prompt": f"{name} {i}", "seed": i, "num_inference_steps": 3}
                    tg.start_soon(router.post, "/rollout/generate", body)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rollout, "a")
            tg.start_soon(rollout, "b")
        assert engine.stats.requests_served == 24
        assert engine.stats.max_generations_in_flight == 3


async def test_when_every_engine_is_down_waiting_requests_fail_together(
    client: EngineClient,
) -> None:
    config = RouterConfig(
        health_interval_s=0.05,
        failure_threshold=1,
        wait_timeout_s=1.0,
        max_inflight_per_engine=1,
    )
    failures: list[float] = []
    started = time.monotonic()
    async with Router([free_url(), free_url()], client, config) as router:

        async def request(i: int) -> None:
            with pytest.raises(EngineUnavailableError) as caught:
                await router.post("/generate", {"i": i}, request_id=f"rid-{i:02d}")
            assert "wait_timeout_s" in str(caught.value) or f"rid-{i:02d}" in str(caught.value)
            failures.append(time.monotonic() - started)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(request, i)
    # Before: each batch of slots waited the full wait in turn (8 requests, 1 slot per
    # engine: ~4 waits). Now all fail within one wait of each other.
    assert len(failures) == 8
    assert max(failures) < 1.0 + 2.5, failures


async def test_an_engine_killed_mid_rollout_loses_nothing_that_never_reached_it(
    client: EngineClient,
) -> None:
    doomed, live = ScriptedEngine(), ScriptedEngine()
    for engine in (doomed, live):
        engine.defaults["/generate"] = Reply(200, b"{}", "application/json", delay_s=0.02)
    doomed_runner = await start_engine(doomed)
    live_runner = await start_engine(live)
    # Probes far apart: the dead engine stays in rotation; only retries elsewhere save it.
    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=60.0, failure_threshold=100)
    served: list[str] = []
    try:
        async with Router([doomed.url, live.url], client, config) as router:
            for i in range(6):
                served.append((await router.post("/generate", {"i": i})).url)  # noqa: PERF401
            await doomed_runner.cleanup()  # killed between requests: connections refused
            for i in range(6, 18):
                served.append((await router.post("/generate", {"i": i})).url)  # noqa: PERF401
    finally:
        await live_runner.cleanup()
    assert len(served) == 18
    assert doomed.url in served[:6]
    assert served[6:] == [live.url] * 12


async def test_errors_name_the_engine_and_the_request_id(client: EngineClient) -> None:
    engine = ScriptedEngine()
    engine.defaults["/generate"] = Reply(400, b"bad sampling params")
    runner = await start_engine(engine)
    try:
        async with Router([engine.url], client, RouterConfig(max_inflight_per_engine=4)) as router:
            with pytest.raises(EngineError) as caught:
                await router.post("/generate", {}, request_id="0123abcd")
    finally:
        await runner.cleanup()
    assert caught.value.url == engine.url and caught.value.request_id == "0123abcd"
    assert "0123abcd" in str(caught.value) and engine.url in str(caught.value)
    sent = [seen for seen in engine.seen if seen.path == "/generate"]
    assert len(sent) == 1  # a 400 is not retried
