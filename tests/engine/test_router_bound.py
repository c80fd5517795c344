"""The per-engine in-flight bound belongs to the engine, whoever leases."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineUnavailableError
from tests.engine.test_router import QUIET, engines, urls_of, wait_until
from tests.support.engine_fakes import Reply, ScriptedEngine

__all__ = ["engines"]  # a fixture shared with test_router

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
            assert sorted(e.in_flight for e in router.statistics().engines) == [0, 2, 2]
            release.set()
            await wait_until(lambda: held == 5)


async def test_leases_waiting_for_a_slot_fail_together_when_every_engine_leaves(
    engines: list[ScriptedEngine], client: EngineClient
) -> None:
    one = urls_of(engines)[:1]
    config = dataclasses.replace(BOUND, max_inflight_per_engine=1, wait_timeout_s=0.3)
    async with Router(one, client, config) as router:
        await wait_until(lambda: router.statistics().health_rounds >= 1)
        failures: list[float] = []

        async def waiter() -> None:
            try:
                async with router.lease():
                    pass
            except EngineUnavailableError:
                failures.append(anyio.current_time())

        release = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def holder() -> None:
                with pytest.raises(EngineUnavailableError):
                    async with router.lease():
                        await release.wait()
                        raise EngineUnavailableError("engine went away")

            tg.start_soon(holder)
            await wait_until(lambda: router.in_flight(one[0]) == 1)
            for _ in range(5):
                tg.start_soon(waiter)
            await anyio.sleep(0.05)
            release.set()  # the holder fails: the only engine leaves the rotation
        assert len(failures) == 5
        assert max(failures) - min(failures) < 0.2  # together, not one wait after another
