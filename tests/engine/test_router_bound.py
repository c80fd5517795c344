"""The per-engine in-flight bound belongs to the engine, whoever leases."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from miles_lite.engine import EngineClient, Router
from tests.engine.engine_fakes import Reply, ScriptedEngine
from tests.engine.test_router import QUIET, client, engines, urls_of, wait_until

__all__ = ["client", "engines"]  # fixtures shared with test_router

pytestmark = pytest.mark.anyio

BOUND = dataclasses.replace(QUIET, max_inflight_per_engine=2, failure_threshold=1)


async def test_two_rollouts_sharing_a_router_never_exceed_the_bound(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    peak: dict[str, int] = {}
    async with Router(urls_of(engines), client, BOUND) as router:

        async def one_lease() -> None:
            async with router.lease() as url:
                peak[url] = max(peak.get(url, 0), router.in_flight(url))
                await anyio.sleep(0.01)

        async def rollout() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(one_lease)

        async with anyio.create_task_group() as tg:
            tg.start_soon(rollout)
            tg.start_soon(rollout)
    assert max(peak.values()) == 2 and len(peak) == 3


async def test_when_an_engine_leaves_the_rotation_the_others_keep_their_bound(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    engines[0].defaults["/health"] = Reply(503)  # it stays out once it has failed
    async with Router(urls_of(engines), client, BOUND) as router:
        await wait_until(lambda: len(router.healthy_urls) == 2)  # its probe failed
        held = 0
        entered = anyio.Event()
        release = anyio.Event()

        async def hold() -> None:
            nonlocal held
            async with router.lease():
                held += 1
                if held == 4:
                    entered.set()
                await release.wait()

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(hold)
            await entered.wait()
            await anyio.sleep(0.05)
            # Four slots on the two healthy engines; the fifth lease waits (no error).
            assert held == 4
            assert sorted(e.in_flight for e in router.stats().engines) == [0, 2, 2]
            release.set()
            await wait_until(lambda: held == 5)
