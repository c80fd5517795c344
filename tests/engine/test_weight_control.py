"""The control sender's weight-update calls: fanned out to every engine, bounded, one
outcome per engine with a typed error naming it; the version bump never aborts; the flush
waits with backoff (never a hot loop) and its effect is checked with a canary; the router
holds leases during an update and keeps an engine that missed it out of rotation until it
reports the version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from miles_lite.engine.cache_control import flush_cache, plant_cache_canary, probe_cache_canary
from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.control import (
    continue_generation,
    pause_generation,
    read_weight_versions,
    update_weight_version,
    update_weights_from_disk,
)
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.mock import MockResponse, MockTransport
from miles_lite.engine.http.transport import Request
from miles_lite.engine.router import Router
from miles_lite.errors import (
    EngineControlError,
    EngineStatusError,
    EngineUnavailableError,
)
from miles_lite.sglang.control import PauseMode
from miles_lite.testing import TextStandInConfig, TextStandInEngine

from .test_router import wait_until

pytestmark = pytest.mark.anyio

ONE_TRY = EngineClientConfig(total_timeout_s=5.0, retry=RetryPolicy(max_attempts=1))


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    async with EngineClient(ONE_TRY) as engine_client:
        yield engine_client


@pytest.fixture
async def two(tokenizer: Any) -> AsyncIterator[list[TextStandInEngine]]:
    engines = [
        TextStandInEngine(TextStandInConfig(token_latency_s=0.01), tokenizer) for _ in range(2)
    ]
    for engine in engines:
        await engine.__aenter__()
    try:
        yield engines
    finally:
        for engine in engines:
            await engine.aclose()


def long_request(client: EngineClient, url: str, answers: list[Any], n: int = 60) -> Any:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}

    async def send() -> None:
        answers.append(await client.post_json(url, "/generate", body, retry=False))

    return send


async def test_each_call_reaches_every_engine_and_names_the_one_that_failed(
    client: EngineClient, two: list[TextStandInEngine], refused_url: str
) -> None:
    urls = [two[0].url, refused_url, two[1].url]
    paused = await pause_generation(client, urls, PauseMode.RETRACT, timeout_s=2.0)
    assert [e.url for e in paused.engines] == urls and paused.failed == (refused_url,)
    assert all(engine.paused for engine in two)
    assert isinstance(paused.outcome(refused_url).error, EngineUnavailableError)
    with pytest.raises(EngineControlError) as caught:
        paused.raise_for_failures()
    assert caught.value.url == refused_url and set(caught.value.failures) == {refused_url}
    assert f"pause_generation(retract) failed at 1 of 3 engine(s): {refused_url}" in str(
        caught.value
    )
    pushed = await update_weights_from_disk(client, urls[::2], "/ckpt/step-1", version="1")
    assert pushed.ok
    versions = await read_weight_versions(client, urls, timeout_s=2.0)
    assert [e.version for e in versions.engines] == ["1", None, "1"]
    resumed = await continue_generation(client, urls[::2])
    assert resumed.ok and not any(engine.paused for engine in two)
    assert all(e.statistics().weight_version == "1" for e in two)
    with pytest.raises(KeyError, match="did not go to"):
        resumed.outcome(refused_url)


async def test_the_version_bump_never_aborts_a_running_request(
    client: EngineClient, two: list[TextStandInEngine]
) -> None:
    answers: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_request(client, two[0].url, answers))
        await wait_until(lambda: two[0].stats.generated_tokens >= 3)
        report = await update_weight_version(client, [two[0].url], "7")
    assert report.ok and two[0].stats.aborts == []
    meta = answers[0]["meta_info"]
    assert meta["finish_reason"]["type"] == "length"
    assert [s["version"] for s in meta["weight_versions"]] == ["default", "7"]


async def test_the_flush_waits_with_backoff_while_requests_run_and_gives_up_in_bound(
    client: EngineClient, two: list[TextStandInEngine]
) -> None:
    engine = two[0]
    answers: list[Any] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_request(client, engine.url, answers, n=40))  # ~0.4 s of tokens
        await wait_until(lambda: engine.stats.running == 1)
        report = await flush_cache(client, [engine.url], timeout_s=10.0, initial_delay_s=0.02)
    assert report.ok and answers
    refused = engine.statistics().flush_refusals
    # Waits of 0.02, 0.04, 0.08, ... s: a 0.4 s request costs a handful of calls, not
    # hundreds (miles #1497 sent 60 in a row with no sleep).
    assert 1 <= refused <= 8 and report.engines[0].attempts == refused + 1
    assert engine.statistics().flushes == 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_request(client, engine.url, answers, n=400))  # ~4 s of tokens
        await wait_until(lambda: engine.stats.running == 1)
        late = await flush_cache(client, [engine.url], timeout_s=0.3, initial_delay_s=0.02)
        tg.cancel_scope.cancel()
    error = late.engines[0].error
    assert isinstance(error, EngineControlError) and error.url == engine.url
    assert isinstance(error.__cause__, EngineStatusError) and error.__cause__.status == 400
    assert "flush_cache refused" in str(error) and late.engines[0].elapsed_s < 1.0
    assert engine.statistics().flush_refusals - refused <= 6


async def test_the_canary_tells_a_flush_that_took_from_one_that_did_not(
    client: EngineClient, two: list[TextStandInEngine]
) -> None:
    urls = [e.url for e in two]
    planted = await plant_cache_canary(client, urls, "key-1")
    assert planted.ok and [e.cached_tokens for e in planted.engines] == [0, 0]
    assert (await flush_cache(client, urls[:1])).ok
    probed = await probe_cache_canary(client, urls, "key-1")
    assert probed.failed == (two[1].url,)
    kept = probed.outcome(two[1].url)
    assert kept.cached_tokens is None and "still held 15 of the canary's 16" in str(kept.error)
    assert probed.outcome(two[0].url).cached_tokens == 0


async def test_a_bad_answer_is_that_engines_typed_error() -> None:
    def handler(request: Request) -> MockResponse:
        if request.path == "/model_info":
            return MockResponse.json({"weight_version": 3})  # not a string
        if request.path == "/update_weights_from_disk":
            return MockResponse.json({"success": False, "message": "no such folder"})
        return MockResponse.json({"status": "paused?"})

    async with EngineClient(ONE_TRY, transport=MockTransport(handler)) as client:
        read = await read_weight_versions(client, ["http://a"])
        pushed = await update_weights_from_disk(client, ["http://a"], "/x", version="2")
        paused = await pause_generation(client, ["http://a"], PauseMode.IN_PLACE)
    assert "names no weight_version" in str(read.engines[0].error)
    assert "success=False: no such folder" in str(pushed.engines[0].error)
    assert "not a status ok" in str(paused.engines[0].error)
    assert all(isinstance(r.engines[0].error, EngineControlError) for r in (read, pushed, paused))


async def test_an_engine_awaiting_a_version_serves_nothing_until_it_reports_it() -> None:
    reported = {"http://a": "1", "http://b": "0"}

    def handler(request: Request) -> MockResponse:
        if request.path == "/model_info":
            return MockResponse.json({"weight_version": reported[request.url]})
        return MockResponse(status=200)

    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=0.02, wait_timeout_s=0.2)
    async with (
        EngineClient(ONE_TRY, transport=MockTransport(handler)) as client,
        Router(["http://a", "http://b"], client, config) as router,
    ):
        router.versions.record("1", mode="retract", kept_kv=False)
        assert not router.reported_version("http://b", "0")
        assert router.healthy_urls == ("http://a",)
        state = router.statistics().engines[1]
        assert state.awaiting_version == "1" and state.healthy
        for _ in range(4):
            async with router.lease() as url:
                assert url == "http://a"
        assert await router.check_versions() == {"http://b": "0"}
        assert router.healthy_urls == ("http://a",)
        reported["http://b"] = "1"  # updated by hand: the health round lets it back
        await wait_until(lambda: router.healthy_urls == ("http://a", "http://b"))
        reported.update({"http://a": "0", "http://b": "0"})  # both restarted, say
        router.await_version("http://a", "1")
        router.await_version("http://b", "1")
        with pytest.raises(EngineUnavailableError, match="until they report a weight version"):
            async with router.lease():
                pass
        with pytest.raises(KeyError, match="not one of the router's engines"):
            router.await_version("http://c", "1")


async def test_leases_wait_while_the_router_holds_them() -> None:
    transport = MockTransport(lambda request: MockResponse(status=200))
    async with (
        EngineClient(ONE_TRY, transport=transport) as client,
        Router(["http://a"], client, RouterConfig(max_inflight_per_engine=4)) as router,
    ):
        got: list[str] = []

        async def lease() -> None:
            async with router.lease() as url:
                got.append(url)

        async with anyio.create_task_group() as tg:
            with router.holding():
                tg.start_soon(lease)
                await anyio.sleep(0.05)
                assert got == []
                with pytest.raises(RuntimeError, match="already in effect"), router.holding():
                    pass
            await wait_until(lambda: got == ["http://a"])


async def test_a_version_read_overtaken_by_a_catch_up_try_is_read_again_after_it() -> None:
    # check_versions reads b's version as b's catch-up starts its next try: a read made
    # mid-load may come before the flush, so it waits for the try and reads again. b was
    # brought to the version by hand, so it rejoins although the try itself failed.
    reported = {"http://a": "0", "http://b": "0"}
    held = {"http://b": False}  # True: b's next version read waits for a load to start
    waiting = anyio.Event()  # that read waits
    loading = anyio.Event()
    loads: list[str] = []

    async def handler(request: Request) -> MockResponse:
        url = request.url
        if request.path == "/model_info":
            if held.get(url):
                held[url] = False
                waiting.set()
                await loading.wait()
            return MockResponse.json({"weight_version": reported[url]})
        if request.path == "/update_weights_from_disk":
            loads.append(url)
            if url == "http://b":
                if waiting.is_set():
                    loading.set()
                return MockResponse.json({"success": False, "message": "does not fit"}, 400)
            reported[url] = "1"
            return MockResponse.json({"success": True, "message": "ok"})
        return MockResponse.json({"status": "ok"})

    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=60.0)
    async with (
        EngineClient(ONE_TRY, transport=MockTransport(handler)) as client,
        Router(["http://a", "http://b"], client, config) as router,
    ):
        report = await router.update_weights("/ckpt", version="1", check=False)
        assert report.behind == ("http://b",)
        await wait_until(lambda: router.statistics().fleet.catch_up_failures == 1)
        reported["http://b"] = "1"  # updated by hand, while its catch-up waits to try again
        held["http://b"] = True
        assert await router.check_versions() == {"http://b": "1"}
        assert loads.count("http://b") == 3  # the update's, and two catch-up tries
        assert router.healthy_urls == ("http://a", "http://b")
