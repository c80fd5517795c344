"""Requests through the router: each retry leases another engine; nothing sent is re-sent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineStatusError, EngineTimeoutError, EngineUnavailableError
from tests.engine.test_router import QUIET, engines, urls_of
from tests.support.engine_fakes import Reply, ScriptedEngine

__all__ = ["engines"]  # fixture shared with test_router

pytestmark = pytest.mark.anyio

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)
JSON = "application/json"


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    config = EngineClientConfig(read_timeout_s=1.0, retry=FAST_RETRY)
    async with EngineClient(config) as engine_client:
        yield engine_client


async def test_post_answers_with_the_url_of_the_engine_that_served(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    engines[0].defaults["/generate"] = Reply(200, b"abc")
    async with Router([engines[0].url], client, QUIET) as router:
        raw = await router.post("/generate", {"x": 1}, request_id="r-1")
    assert (raw.url, bytes(raw.body), raw.request_id) == (engines[0].url, b"abc", "r-1")
    sent = [seen.body for seen in engines[0].seen if seen.path == "/generate"]
    assert [json.loads(body) for body in sent] == [{"x": 1}]


async def test_a_503_is_retried_on_another_engine(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    a, b, c = engines
    for engine in engines:
        engine.defaults["/generate"] = Reply(503, b"busy")
    b.defaults["/generate"] = Reply(200, b'{"served": "b"}', JSON)
    async with Router(urls_of(engines), client, QUIET) as router:
        for _ in range(3):
            assert await router.post_json("/generate", {}) == {"served": "b"}
    # No engine got the same request twice in one call: each retry went elsewhere.
    assert a.count("/generate") <= 3 and c.count("/generate") <= 3
    assert b.count("/generate") == 3


async def test_a_read_timeout_is_not_sent_again(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    slow, well = engines[0], engines[1]
    slow.defaults["/generate"] = Reply(200, b"{}", JSON, delay_s=5.0)
    well.defaults["/generate"] = Reply(200, b"{}", JSON)
    async with Router([slow.url], client, QUIET) as router:
        with pytest.raises(EngineTimeoutError) as caught:
            await router.post("/generate", {}, request_id="gen-7")
    assert slow.count("/generate") == 1
    assert caught.value.retryable is False
    assert "gen-7" in str(caught.value) and slow.url in str(caught.value)


async def test_the_failure_of_the_last_attempt_is_raised(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    for engine in engines:
        engine.defaults["/model_info"] = Reply(502, b"gateway")
    async with Router(urls_of(engines), client, QUIET) as router:
        with pytest.raises(EngineStatusError) as caught:
            await router.get_json("/model_info")
    assert caught.value.status == 502
    assert sum(engine.count("/model_info") for engine in engines) == FAST_RETRY.max_attempts
    assert all(engine.count("/model_info") == 1 for engine in engines)


async def test_refused_connections_move_to_the_live_engine(
    engines: list[ScriptedEngine], client: EngineClient, refused_url: str
) -> None:
    live = engines[0]
    live.defaults["/generate"] = Reply(200, b"{}", JSON)
    config = dataclasses.replace(QUIET, failure_threshold=100, wait_timeout_s=1.0)
    async with Router([refused_url, live.url], client, config) as router:
        served = [(await router.post("/generate", {})).url for _ in range(6)]
    assert served == [live.url] * 6
    assert live.count("/generate") == 6


async def test_no_healthy_engine_raises_unavailable(client: EngineClient, refused_url: str) -> None:
    async with Router([refused_url], client, QUIET) as router:
        with pytest.raises(EngineUnavailableError) as caught:
            await router.post("/generate", {}, request_id="gen-9")
    # Refused by the engine, or (once probes removed it) no healthy engine left.
    assert refused_url in str(caught.value)
