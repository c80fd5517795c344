"""The health loop: every engine's ``/health`` probed each round, the results fed to the
balancer, which takes failing engines out of rotation and lets recovered ones back in.

Like miles' router, an engine that fails ``failure_threshold`` times in a row leaves the
rotation. Unlike it, removed engines keep being probed and are re-admitted once their
``/health`` answers 2xx after ``readmit_cooldown_s`` (an engine restarted after a crash
comes back by itself). A passing probe does not clear request failures: an engine whose
``/health`` answers while its generations time out still leaves the rotation, and is let
back only after the cool-down, so it cannot flap in and out every probe round.

An engine that missed a weight update (it awaits a version) is also asked its
``/model_info`` each round, once its ``/health`` passes: it rejoins the rotation when it
reports the version (its weights were updated after all, or again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from miles_lite.engine.balancer import Balancer, EngineSlot
from miles_lite.errors import EngineError
from miles_lite.sglang.control import MODEL_INFO_PATH, model_info_version

if TYPE_CHECKING:
    from miles_lite.engine.http.client import EngineClient

__all__ = ["HealthMonitor"]


class HealthMonitor:
    """Probes every engine of ``balancer`` each ``health_interval_s`` (see the module doc)."""

    def __init__(self, balancer: Balancer, client: EngineClient) -> None:
        self._balancer = balancer
        self._client = client
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
        if ok and engine.awaiting_version is not None:
            await self.probe_version(engine)

    async def probe_version(self, engine: EngineSlot) -> str | None:
        """Ask ``engine`` its weight version (``/model_info``, one bounded attempt) and
        tell the balancer; the version, or None when it did not say."""
        timeout_s = self._balancer.config.health_timeout_s
        version = None
        with anyio.move_on_after(timeout_s):
            try:
                info = await self._client.get_json(
                    engine.url, MODEL_INFO_PATH, timeout_s=timeout_s, retry=False
                )
            except EngineError:
                info = None
            version = model_info_version(info)
        self._balancer.record_version(engine, version)
        return version
