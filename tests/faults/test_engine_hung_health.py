"""An engine whose /health answers 200 while its generations hang leaves the rotation (issue 11).

Before: every passing probe reset the failure count, so the engine stayed in rotation and
cost a read timeout per request in every rollout. Now request failures and probes keep
their own streaks, and a removed engine is let back only after ``readmit_cooldown_s``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineTimeoutError
from tests.engine.test_router import wait_until
from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine

pytestmark = pytest.mark.anyio

#: Probes every 20 ms: many passing probes land between two failed requests.
CONFIG = RouterConfig(
    max_inflight_per_engine=4,
    health_interval_s=0.02,
    failure_threshold=2,
    health_timeout_s=0.5,
    wait_timeout_s=1.0,
    readmit_cooldown_s=0.6,
)


@pytest.fixture
async def engines() -> AsyncIterator[tuple[ScriptedEngine, ScriptedEngine]]:
    """A hung engine (health 200, /generate answers after 30 s) and a well one."""
    hung, well = ScriptedEngine(), ScriptedEngine()
    hung.defaults["/generate"] = Reply(200, b"{}", "application/json", delay_s=30.0)
    well.defaults["/generate"] = Reply(200, b'{"ok": true}', "application/json")
    runners = [await start_engine(hung), await start_engine(well)]
    try:
        yield hung, well
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    config = EngineClientConfig(read_timeout_s=0.2, retry=RetryPolicy(max_attempts=3))
    async with EngineClient(config) as engine_client:
        yield engine_client


async def post_ignoring_timeouts(router: Router) -> None:
    with contextlib.suppress(EngineTimeoutError):  # the hung engine served it
        await router.post("/generate", {})


async def test_request_timeouts_take_out_an_engine_whose_health_passes(
    engines: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    hung, _ = engines
    async with Router([hung.url], client, CONFIG) as router:
        for attempt in range(2):
            probes = hung.count("/health")
            with pytest.raises(EngineTimeoutError) as caught:
                await router.post("/generate", {"n": attempt}, request_id=f"rid-{attempt}")
            assert caught.value.request_id == f"rid-{attempt}"
            assert caught.value.url == hung.url
            # Passing probes ran between the failures, and did not clear them.
            await wait_until(lambda n=probes + 3: hung.count("/health") >= n, timeout_s=10.0)
        assert router.healthy_urls == ()
        # A read timeout is never re-sent: one request per call reached the engine.
        assert hung.count("/generate") == 2
        state = router.statistics().engines[0]
        assert (state.removals, state.readmissions) == (1, 0)


async def test_a_removed_engine_is_let_back_only_after_the_cooldown(
    engines: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    hung, well = engines
    async with Router([hung.url, well.url], client, CONFIG) as router:
        with anyio.fail_after(10):
            while hung.url in router.healthy_urls:
                await post_ignoring_timeouts(router)
        removed_at = anyio.current_time()
        # Passing probes every 20 ms, yet it stays out while cooling down...
        await anyio.sleep(0.3)
        assert router.healthy_urls == (well.url,)
        for i in range(4):  # ...and nothing goes to it meanwhile
            answer = await router.post("/generate", {"i": i})
            assert answer.url == well.url
        await wait_until(lambda: hung.url in router.healthy_urls, timeout_s=5.0)
        assert anyio.current_time() - removed_at >= CONFIG.readmit_cooldown_s - 0.05
        assert router.statistics().engines[0].readmissions == 1
