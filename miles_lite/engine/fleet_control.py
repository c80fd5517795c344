"""The router's fleet methods (a base of :class:`~miles_lite.engine.router.Router`): the
version gate, weight updates (:mod:`~miles_lite.engine.updates`), and engines added and
removed at runtime (:mod:`~miles_lite.engine.fleet`)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio

from miles_lite.engine.balancer import Balancer, EngineSlot
from miles_lite.engine.control import abort_requests
from miles_lite.engine.fleet import Fleet, WeightSource
from miles_lite.engine.versions import WeightVersions

if TYPE_CHECKING:
    from miles_lite.engine.http.client import EngineClient
    from miles_lite.engine.smg import SmgFront

__all__ = ["FleetControl"]

_log = logging.getLogger("miles_lite.engine.router")


class FleetControl:
    """What the router does about its engines' weights and membership (see the module
    doc); the state is the router's."""

    _front: SmgFront | None
    _client: EngineClient
    _fleet: Fleet
    _balancer: Balancer
    versions: WeightVersions

    if TYPE_CHECKING:

        def _check_open(self, *, url: str | None = None, request_id: str | None = None) -> None: ...

        def _engine(self, url: str) -> EngineSlot: ...

    def reported_version(self, url: str, version: str | None) -> bool:
        """The engine at ``url`` reports weight ``version``: it serves again if that is the
        current version (:attr:`versions`); otherwise it is fenced and caught up
        (:mod:`~miles_lite.engine.fleet`). Whether it is clear of the version gate.
        ``KeyError`` for an unknown URL.

        Through SGLang's router (which chooses the engine), an engine behind it reporting
        another version is taken off smg's worker list (``DELETE /workers/{id}``: smg
        routes it nothing new, what it holds goes on), caught up from the last update's
        source, and registered again (``POST /workers``) once it reports the current
        version (:meth:`Fleet.fence_worker <miles_lite.engine.fleet.Fleet.fence_worker>`)."""
        current = self.versions.current
        if self._behind_front(url):
            if current is not None and version != current:
                assert self._front is not None
                why = f"it reports weight version {version!r}"
                self._fleet.fence_worker(self._front, url, current, why)
                return False
            return True
        return self._fleet.reported(self._engine(url), version)

    def await_version(self, url: str, version: str) -> None:
        """Take the engine at ``url`` out of rotation until it reports weight ``version``
        (it missed that update): the fleet catches it up from the last update's source,
        each health round asks its ``/model_info``, and :meth:`check_versions` does at
        once. ``KeyError`` for an unknown URL; behind SGLang's router, see
        :meth:`reported_version`."""
        if self._behind_front(url):
            assert self._front is not None
            self._fleet.fence_worker(self._front, url, version, "told to await it")
            return
        self._fleet.fence(self._engine(url), version, "told to await it")

    def _behind_front(self, url: str) -> bool:
        return self._front is not None and url in self._front.engine_urls

    async def check_versions(self) -> dict[str, str | None]:
        """Ask every engine out of rotation for its weights or its return for its version
        now (one bounded ``/model_info`` each, concurrently); those reporting the current
        one rejoin the rotation. One a catch-up is loading weights into is asked once that
        try ended (a version read mid-load can come before its cache flush). Returns what
        each reported (None: no answer)."""
        waiting = [
            e for e in self._balancer.engines if e.awaiting_version is not None or e.checking
        ]
        found: dict[str, str | None] = {}

        async def ask(engine: EngineSlot) -> None:
            found[engine.url] = await self._fleet.check(engine, settle=True)

        async with anyio.create_task_group() as tg:
            for engine in waiting:
                tg.start_soon(ask, engine)
        return found

    # -- the fleet: weight updates, joins and removals ----------------------------------

    @property
    def source(self) -> WeightSource | None:
        """Where the current weights came from (the last update that moved the version);
        what an engine that reports another version is caught up from."""
        return self._fleet.source

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Give no lease for the duration of the block (a weight update runs): requests
        wait in the router, not at paused engines, and leave with the new version's cache
        key. Leases already given are not affected. Not reentrant."""
        if self._balancer.held:
            raise RuntimeError("router.holding() is already in effect (one update at a time)")
        self._balancer.hold(True)
        try:
            yield
        finally:
            self._balancer.hold(False)

    def update_targets(self) -> tuple[str, ...]:
        """The engines a weight update goes to: healthy and not draining (through SGLang's
        router, every engine it lists)."""
        if self._front is not None:
            return self._front.engine_urls
        return tuple(e.url for e in self._balancer.engines if e.healthy and not e.draining)

    def settle_update(
        self, source: WeightSource, took: Collection[str], *, mode: str, kept_kv: bool
    ) -> tuple[str, ...]:
        """An update to ``source`` was taken by the engines ``took``: record its version
        and source; fence every other engine (caught up from it). The engines left
        behind."""
        self.versions.record(source.version, mode=mode, kept_kv=kept_kv)
        self._fleet.source = source
        if self._front is not None:
            behind = tuple(u for u in self._front.engine_urls if u not in took)
            for url in behind:
                self.reported_version(url, None)
            return behind
        behind = tuple(e.url for e in self._balancer.engines if e.url not in took)
        for url in behind:
            engine = self._balancer.by_url[url]
            self._fleet.fence(engine, source.version, "it did not take the update")
        return behind

    async def add_engine(self, url: str) -> bool:
        """Add the engine at ``url``: probed, brought to the current weights (the last
        update's source) and only then routed to. Whether it serves now; otherwise the
        health loop and its catch-up go on (see :mod:`~miles_lite.engine.fleet`).
        ``ConfigError`` for a bad or known URL. Through SGLang's router, the engine is
        registered with smg (``POST /workers``) only once it reports the current version
        (caught up first when it does not); False then (smg adds it in the background)."""
        self._check_open()
        if self._front is not None:
            front = self._front
            version = await self._fleet.read_url_version(url)
            current = self.versions.current
            if current is None or version == current:
                await front.add_worker(url)
            else:
                why = f"it joins reporting weight version {version!r}"
                self._fleet.fence_worker(front, url, current, why)
            return False
        return await self._fleet.add(url)

    async def remove_engine(
        self, url: str, *, drain: bool = True, abort_timeout_s: float = 10.0
    ) -> None:
        """Remove the engine at ``url``: it takes no new request; with ``drain`` its
        requests finish, else they are aborted (they come back as partial samples,
        within ``abort_timeout_s``); then it is forgotten. ``KeyError`` for an unknown
        URL. Through SGLang's router, the worker is taken off smg (``DELETE
        /workers/{id}``: it routes it nothing new); without ``drain`` the engine's
        requests are aborted there too. ``KeyError`` when smg does not list it."""
        self._check_open()
        if self._front is not None:
            if not await self._front.remove_worker(url):
                raise KeyError(url)
            if not drain:
                await abort_requests(
                    self._client,
                    {url: ()},
                    abort_all=True,
                    timeout_s=abort_timeout_s,
                    settle_timeout_s=abort_timeout_s,
                )
            return
        engine = self._engine(url)
        await self._fleet.remove(engine, drain=drain, abort_timeout_s=abort_timeout_s)
