"""Router: least in flight, sticky keys, failure threshold, re-admission, waiting, clean exit."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import anyio
import anyio.lowlevel
import pytest

from miles_lite.engine.config import RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import (
    ClosedResourceError,
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine
from tests.support.polling import wait_until

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup

#: Health rounds so far apart that only the one at start runs during a test.
QUIET = RouterConfig(
    max_inflight_per_engine=4,
    health_interval_s=30.0,
    failure_threshold=2,
    health_timeout_s=1.0,
    wait_timeout_s=1.0,
)
#: Health rounds every 20 ms.
BUSY = RouterConfig(
    max_inflight_per_engine=4,
    health_interval_s=0.02,
    failure_threshold=2,
    health_timeout_s=0.5,
    wait_timeout_s=1.0,
    readmit_cooldown_s=0.0,
)


@pytest.fixture
async def engines() -> AsyncIterator[list[ScriptedEngine]]:
    """Three running test engines."""
    scripted = [ScriptedEngine() for _ in range(3)]
    runners = [await start_engine(engine) for engine in scripted]
    try:
        yield scripted
    finally:
        for runner in runners:
            await runner.cleanup()


async def fail_lease(router: Router, error: Exception, key: str | None = None) -> str:
    """Take a lease and leave it with ``error`` (its url filled in); return the url."""
    with pytest.raises(type(error)):
        async with router.lease(key) as url:
            raise error.with_context(url=url)
    return url


def urls_of(engines: list[ScriptedEngine]) -> list[str]:
    return [engine.url for engine in engines]


@pytest.mark.anyio
async def test_least_in_flight_spreads_concurrent_leases(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    urls = urls_of(engines)
    async with Router(urls, client, QUIET) as router, AsyncExitStack() as stack:
        leased = [await stack.enter_async_context(router.lease()) for _ in range(7)]
        assert sorted(Counter(leased).values()) == [2, 2, 3]
        assert sum(router.in_flight(url) for url in urls) == 7
    assert [router.in_flight(url) for url in urls] == [0, 0, 0]


@pytest.mark.anyio
async def test_least_loaded_engine_is_chosen(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    a, b, c = urls_of(engines)
    async with (
        Router([a, b, c], client, QUIET) as router,
        router.lease() as first,
        router.lease() as second,
    ):
        assert {first, second} == {a, b}
        async with router.lease() as third:
            assert third == c


@pytest.mark.anyio
async def test_ties_go_round_robin(engines: list[ScriptedEngine], client: EngineClient) -> None:
    urls = urls_of(engines)
    picked = []
    async with Router(urls, client, QUIET) as router:
        for _ in range(6):
            async with router.lease() as url:
                picked.append(url)
    assert picked == urls + urls
    assert [state.leases for state in router.statistics().engines] == [2, 2, 2]


@pytest.mark.anyio
async def test_engine_leaves_rotation_after_threshold_failures_in_a_row(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    a, b, c = urls_of(engines)
    async with Router([a, b, c], client, QUIET) as router:
        async with router.lease(key="k") as url:
            assert url == a
        await fail_lease(router, EngineUnavailableError("refused"), key="k")
        async with router.lease(key="k"):
            pass  # a success resets the count
        await fail_lease(router, EngineTimeoutError("slow"), key="k")
        assert router.healthy_urls == (a, b, c)
        await fail_lease(router, EngineStatusError("busy", status=503), key="k")
        assert router.healthy_urls == (b, c)
        for _ in range(4):
            async with router.lease() as url:
                assert url != a
        state = router.statistics().engines[0]
        assert (state.healthy, state.failures, state.removals) == (False, 3, 1)


@pytest.mark.anyio
async def test_only_errors_about_a_failing_engine_count(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    a = engines[0].url
    async with Router([a], client, QUIET) as router:
        for error in [
            EngineStatusError("bad request", status=400),
            # SGLang answers 500 to some bodies it cannot handle: the request's fault.
            EngineStatusError("internal error", status=500),
            EngineProtocolError("truncated"),
            EngineUnavailableError("another engine", url="http://elsewhere:1"),
        ]:
            await fail_lease(router, error)
        with pytest.raises(ValueError):
            async with router.lease():
                raise ValueError("a bug in the caller")
        assert router.statistics().engines[0].failures == 0
        with pytest.raises(ExceptionGroup):
            async with router.lease() as url:
                raise ExceptionGroup(
                    "tasks", [ValueError("x"), EngineUnavailableError("down", url=url)]
                )
        assert router.statistics().engines[0].consecutive_failures == 1
        with anyio.CancelScope() as scope:
            async with router.lease():
                scope.cancel()
                await anyio.sleep(1)
        assert router.statistics().engines[0].consecutive_failures == 1
        assert router.in_flight(a) == 0


@pytest.mark.anyio
async def test_removed_engine_comes_back_when_its_health_passes(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    sick, well = engines[0], engines[1]
    sick.defaults["/health"] = Reply(503)
    async with Router([sick.url, well.url], client, BUSY) as router:
        await wait_until(lambda: router.healthy_urls == (well.url,))
        probes = sick.count("/health")
        await wait_until(lambda: sick.count("/health") > probes + 2)  # still probed while out
        for _ in range(3):
            async with router.lease() as url:
                assert url == well.url
        sick.defaults["/health"] = Reply(200)
        await wait_until(lambda: router.healthy_urls == (sick.url, well.url))
        state = router.statistics().engines[0]
        assert (state.removals, state.readmissions, state.consecutive_failures) == (1, 1, 0)


@pytest.mark.anyio
async def test_sticky_key_keeps_its_engine_while_healthy(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    a, b, c = urls_of(engines)
    async with Router([a, b, c], client, QUIET) as router:
        async with router.lease("session-1") as first, router.lease("session-1") as again:
            assert again == first  # even though it is now the busiest
        for _ in range(2):
            moved = await fail_lease(router, EngineUnavailableError("down"), key="session-1")
            assert moved == first
        assert first not in router.healthy_urls
        async with router.lease("session-1") as second:
            assert second != first
        async with router.lease("session-1") as third:
            assert third == second
        router.forget("session-1")


@pytest.mark.anyio
async def test_all_down_lease_waits_then_errors(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    for engine in engines:
        engine.defaults["/health"] = Reply(503)
    config = RouterConfig(
        max_inflight_per_engine=4, health_interval_s=0.02, failure_threshold=1, wait_timeout_s=0.1
    )
    urls = urls_of(engines)
    async with Router(urls, client, config) as router:
        await wait_until(lambda: router.healthy_urls == ())
        with pytest.raises(EngineUnavailableError) as caught:
            async with router.lease():
                pass
        assert all(url in str(caught.value) for url in urls)
        assert (router.statistics().waits, router.statistics().wait_timeouts) == (1, 1)


@pytest.mark.anyio
async def test_waiting_lease_gets_the_engine_that_comes_back(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    engine = engines[0]
    engine.defaults["/health"] = Reply(503)
    config = RouterConfig(
        max_inflight_per_engine=4,
        health_interval_s=0.02,
        failure_threshold=1,
        wait_timeout_s=3.0,
        readmit_cooldown_s=0.0,
    )
    got: list[str] = []

    async def take() -> None:
        async with router.lease() as url:
            got.append(url)

    async with Router([engine.url], client, config) as router:
        await wait_until(lambda: router.healthy_urls == ())
        async with anyio.create_task_group() as tg:
            tg.start_soon(take)
            await wait_until(lambda: router.statistics().waits == 1)
            assert got == []
            engine.defaults["/health"] = Reply(200)
    assert got == [engine.url]


@pytest.mark.anyio
async def test_health_loop_stops_on_exit(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    engine = engines[0]
    router = Router([engine.url], client, BUSY)
    with pytest.raises(ClosedResourceError, match="not open"):
        async with router.lease():
            pass
    async with router:
        await wait_until(lambda: router.statistics().health_rounds >= 2)
        assert any("router health loop" in task.get_name() for task in asyncio.all_tasks())
    assert not any("router health loop" in task.get_name() for task in asyncio.all_tasks())
    probes = engine.count("/health")
    await anyio.sleep(0.1)
    assert engine.count("/health") == probes
    with pytest.raises(ClosedResourceError, match="closed"):
        async with router.lease():
            pass
    with pytest.raises(ClosedResourceError):
        async with router:
            pass


@pytest.mark.anyio
async def test_errors_of_the_block_propagate_unwrapped(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    with pytest.raises(KeyError, match="mine"):
        async with Router([engines[0].url], client, BUSY):
            await anyio.sleep(0.05)
            raise KeyError("mine")
    await anyio.lowlevel.checkpoint()  # not cancelled by the router's task group
    with anyio.CancelScope() as scope:
        async with Router([engines[0].url], client, BUSY):
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_unreachable_engine_is_removed_by_the_health_loop(
    engines: list[ScriptedEngine], client: EngineClient, refused_url: str
) -> None:
    async with Router([refused_url, engines[0].url], client, BUSY) as router:
        await wait_until(lambda: router.healthy_urls == (engines[0].url,))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("health_interval_s", 0),
        ("health_timeout_s", -1.0),
        ("wait_timeout_s", float("inf")),
        ("failure_threshold", 0),
        ("max_sticky_keys", 1.5),
        ("max_inflight_per_engine", 0),
        ("readmit_cooldown_s", -0.5),
        ("readmit_cooldown_s", True),
    ],
)
def test_router_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    fields: dict[str, object] = {"max_inflight_per_engine": 4, field: value}
    with pytest.raises(ConfigError, match=field):
        RouterConfig(**fields)  # type: ignore[arg-type]


def test_the_in_flight_bound_has_no_silent_default() -> None:
    # A text engine takes hundreds of requests, a diffusion engine a few: no one default
    # fits both, so the router's own config has none (the rollout configs carry one).
    with pytest.raises(TypeError, match="max_inflight_per_engine"):
        RouterConfig()  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("urls", "message"),
    [([], "at least one"), (["http://a:1", "http://a:1"], "distinct"), ("http://a:1", "string")],
)
def test_router_rejects_bad_urls(urls: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Router(urls, EngineClient(), BUSY)


def test_router_and_client_can_be_made_outside_the_event_loop() -> None:
    router = Router(["http://a:1", "http://b:2"], EngineClient(), BUSY)
    assert router.urls == router.healthy_urls == ("http://a:1", "http://b:2")
    assert router.in_flight("http://a:1") == 0
    with pytest.raises(KeyError, match="not one of"):
        router.in_flight("http://c:3")
