"""The health loop: every engine's ``/health`` probed each round, the results fed to the
balancer, which takes failing engines out of rotation and lets recovered ones back in.

Like miles' router, an engine that fails ``failure_threshold`` times in a row leaves the
rotation. Unlike it, removed engines keep being probed and are re-admitted once their
``/health`` answers 2xx after ``readmit_cooldown_s`` (an engine restarted after a crash
comes back by itself). A passing probe does not clear request failures: an engine whose
``/health`` answers while its generations time out still leaves the rotation, and is let
back only after the cool-down, so it cannot flap in and out every probe round.

An engine out of rotation for its weights (it awaits a version) or for its return (it
left for its health, or just joined) is handed to the fleet
(:meth:`Fleet.check <miles_lite.engine.fleet.Fleet.check>`) once its ``/health`` passes:
its stale aborts are sent again, its ``/model_info`` is read, and it rejoins the rotation
only at the current weight version (the fleet catches it up otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from miles_lite.engine.balancer import Balancer, EngineSlot

if TYPE_CHECKING:
    from miles_lite.engine.fleet import Fleet
    from miles_lite.engine.http.client import EngineClient

__all__ = ["HealthMonitor"]


class HealthMonitor:
    """Probes every engine of ``balancer`` each ``health_interval_s`` (see the module doc)."""

    def __init__(self, balancer: Balancer, client: EngineClient, fleet: Fleet) -> None:
        self._balancer = balancer
        self._client = client
        self._fleet = fleet
        self.rounds = 0

    async def run(self) -> None:
        """Probe forever (until cancelled), one round per ``health_interval_s``."""
        config = self._balancer.config
        while True:
            async with anyio.create_task_group() as task_group:
                for engine in self._balancer.engines:
                    task_group.start_soon(self._probe, engine)
            self.rounds += 1
            await anyio.sleep(config.health_interval_s)

    async def _probe(self, engine: EngineSlot) -> None:
        timeout_s = self._balancer.config.health_timeout_s
        ok = False
        with anyio.move_on_after(timeout_s):
            ok = await self._client.health(engine.url, timeout_s=timeout_s)
        self._balancer.record_probe(engine, ok)
        if ok and engine.healthy and (engine.awaiting_version is not None or engine.checking):
            await self._fleet.check(engine)
