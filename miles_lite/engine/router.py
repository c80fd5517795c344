"""The router: leases on engines (:mod:`~miles_lite.engine.balancer`), their health
(:mod:`~miles_lite.engine.health`), and :meth:`Router.call`, the one retry loop of
requests to engines.

With ``RouterConfig.smg`` it leases SGLang's router instead (:mod:`~miles_lite.engine.smg`):
one front, whose engines it lists for the control senders (:attr:`Router.urls`,
:meth:`Router.engines_behind`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from miles_lite._core.resources import AsyncResource
from miles_lite.engine.balancer import Balancer, EngineSlot, EngineState
from miles_lite.engine.config import RetryPolicy, RouterConfig
from miles_lite.engine.control import abort_request
from miles_lite.engine.fleet import Fleet, FleetStatistics
from miles_lite.engine.fleet_control import FleetControl
from miles_lite.engine.health import HealthMonitor
from miles_lite.engine.http._routing import sticky
from miles_lite.engine.readiness import SHORT_READY_WAIT_S, not_ready, refuses
from miles_lite.engine.smg import SmgFront, SmgWorker
from miles_lite.engine.updates import WeightUpdateConfig, WeightUpdateReport, update_engines
from miles_lite.engine.versions import WeightVersions

if TYPE_CHECKING:
    import os

    from miles_lite.engine.http.client import EngineClient
    from miles_lite.engine.http.response import BodyAllocator, RawResponse

__all__ = ["Router", "RouterStatistics"]

T = TypeVar("T")

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    """A snapshot of the router: every engine's state, and how often leases had to wait.

    ``waits``: leases that found no healthy engine and waited; ``wait_timeouts``: those
    that gave up with ``EngineUnavailableError``; ``health_rounds``: probe rounds run.
    Through SGLang's router, ``engines`` holds the one front and ``workers`` the engines
    it listed last (``()`` otherwise); ``worker_refresh_failures`` counts failed reads of
    that list. ``fleet``: the joins, removals, fences, catch-ups and returns
    (:class:`~miles_lite.engine.fleet.FleetStatistics`).
    """

    engines: tuple[EngineState, ...]
    waits: int
    wait_timeouts: int
    health_rounds: int
    workers: tuple[SmgWorker, ...] = ()
    worker_refresh_failures: int = 0
    fleet: FleetStatistics = field(default_factory=FleetStatistics)


class Router(AsyncResource, FleetControl):
    """Spreads requests over engines: least in flight, sticky keys, health checks.

    An async resource: entering starts the health loop in the router's own task group,
    leaving cancels it and waits for it (nothing outlives the block). Leases are refused
    (``ClosedResourceError``) outside the block. Not thread-safe; use it from one event
    loop.

    With ``config.smg`` (SGLang's router at the one URL given): entering waits until it
    lists ``min_workers`` healthy engines; every lease is on the router's URL, at most
    ``max_inflight_per_engine`` x the healthy engines it lists at once (read again every
    ``health_interval_s``); it leaves the rotation after ``failure_threshold`` failures of
    its own (unreachable, no engine available) and comes back when ``/readiness``
    passes. Which engine serves, and engine health, are smg's; a sticky key reaches it
    as a header. :attr:`urls` are the engines it lists, for aborts, pauses and weights.

    Usage::

        async with Router(urls, client, RouterConfig(max_inflight_per_engine=64)) as router:
            async with router.lease(key=session_id) as url:
                raw = await client.post(url, "/generate", payload)
    """

    _resource_name = "router"

    def __init__(self, urls: Sequence[str], client: EngineClient, config: RouterConfig) -> None:
        super().__init__()
        self._front = SmgFront(urls, client, config) if config.smg is not None else None
        self._balancer = Balancer(urls, config)
        self._client = client
        self._config = config
        #: The weight versions the engines were updated to (see
        #: :class:`~miles_lite.engine.versions.WeightVersions`).
        self.versions = WeightVersions()
        self._fleet = Fleet(self._balancer, client, self.versions)
        self._health = HealthMonitor(self._balancer, client, self._fleet)
        self._random = random.Random()
        self._stack: AsyncExitStack | None = None
        if self._front is not None:
            self._balancer.check_returns = False  # smg's engines are smg's to check

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine's URL, in the order given; through SGLang's router, the engines it
        listed last (the targets of aborts, pauses and weight updates)."""
        if self._front is not None:
            return self._front.engine_urls
        return self._balancer.urls

    @property
    def healthy_urls(self) -> tuple[str, ...]:
        """The URLs of engines in rotation (healthy, and not awaiting a weight version
        they missed), in the order given; through SGLang's router, those it reports
        healthy."""
        if self._front is not None:
            return self._front.healthy_urls
        return self._balancer.healthy_urls

    @property
    def front(self) -> str | None:
        """SGLang's router URL when generating through it (``config.smg``), else None."""
        return self._front.url if self._front is not None else None

    def engines_behind(self, url: str) -> tuple[str, ...]:
        """The engines a request sent to ``url`` may be running at: every engine the
        router lists when ``url`` is SGLang's router (which engine took it is smg's
        choice), else ``url`` itself."""
        if self._front is not None and url == self._front.url:
            return self._front.engine_urls
        return (url,)

    def abort_targets(self, rids_by_url: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
        """``rids_by_url`` (rids by the URL each was sent to) as rids by engine, for
        :func:`~miles_lite.engine.control.abort_requests`: a rid sent to SGLang's router
        is aborted at every engine it lists (an engine without it ignores the abort)."""
        out: dict[str, list[str]] = {}
        for url, rids in rids_by_url.items():
            for engine in self.engines_behind(url):
                out.setdefault(engine, []).extend(rids)
        return out

    async def abort_request(self, url: str, rid: str, *, timeout_s: float) -> bool:
        """Abort ``rid``, sent to ``url``, at the engine(s) that may hold it
        (:meth:`engines_behind`), concurrently, with
        :func:`~miles_lite.engine.control.abort_request`: one attempt each, bounded by
        ``timeout_s`` and shielded from cancellation. Whether an engine took it."""
        engines = self.engines_behind(url)
        if len(engines) == 1:
            took = await abort_request(self._client, engines[0], rid, timeout_s=timeout_s)
            slot = self._balancer.by_url.get(engines[0])
            if not took and slot is not None and self._front is None:
                self._fleet.owe_abort(slot, rid)  # sent again when it answers
            return took
        taken: list[bool] = []

        async def one(engine: str) -> None:
            taken.append(await abort_request(self._client, engine, rid, timeout_s=timeout_s))

        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for engine in engines:
                    tg.start_soon(one, engine)
        return any(taken)

    @property
    def capacity(self) -> int:
        """Requests the engines take at once: ``max_inflight_per_engine`` x engines (through
        SGLang's router, x the healthy engines it listed last)."""
        return self._balancer.capacity

    @property
    def client(self) -> EngineClient:
        """The engine client requests through this router are sent with."""
        return self._client

    @property
    def config(self) -> RouterConfig:
        """The settings this router was made with."""
        return self._config

    def in_flight(self, url: str) -> int:
        """Leases open now on ``url``; ``KeyError`` if the router does not know it."""
        return self._engine(url).in_flight

    def statistics(self) -> RouterStatistics:
        """A snapshot of every engine's state and of the lease waits."""
        balancer = self._balancer
        front = self._front
        return RouterStatistics(
            engines=tuple(engine.state() for engine in balancer.engines),
            waits=balancer.waits,
            wait_timeouts=balancer.wait_timeouts,
            health_rounds=self._health.rounds,
            workers=front.workers if front is not None else (),
            worker_refresh_failures=front.refresh_failures if front is not None else 0,
            fleet=self._fleet.statistics(),
        )

    async def wait_ready(self, timeout_s: float | None = None) -> tuple[str, ...]:
        """Wait until every engine answers ``/health`` 2xx, at most ``timeout_s`` seconds
        (default: ``config.ready_timeout_s``; ``None`` there: return at once); return the
        URLs that answered.

        Engines are probed together, again every ``0.25`` s while some are silent (an
        engine still starting refuses connections, or answers 503). A wait no longer than
        :class:`RouterConfig`'s default (5 s) checks that the engines already serve: there
        an engine that refuses the connection is not probed again (nothing listens; an
        engine loading weights needs a longer wait anyway). Raises
        :class:`~miles_lite.errors.EngineNotReadyError` naming every URL (and those that
        refused) when none answered; when some did, the silent ones are logged and left to
        the health loop (it takes them out of rotation if they keep failing). Cancellation
        propagates.
        """
        self._check_open()
        timeout_s = self._config.ready_timeout_s if timeout_s is None else timeout_s
        if timeout_s is None:
            return self.urls
        deadline = anyio.current_time() + timeout_s
        refused_is_final = timeout_s <= SHORT_READY_WAIT_S
        ready: set[str] = set()
        refused: set[str] = set()
        while True:
            silent = [url for url in self.urls if url not in ready and url not in refused]
            left = deadline - anyio.current_time()
            if not silent or left <= 0:
                break
            probe_s = max(0.05, min(left, self._config.health_timeout_s))

            async def probe(url: str, probe_s: float = probe_s) -> None:
                with anyio.move_on_after(probe_s):
                    if await self._client.health(url, timeout_s=probe_s):
                        ready.add(url)
                    elif refused_is_final and await refuses(url):
                        refused.add(url)

            async with anyio.create_task_group() as tg:
                for url in silent:
                    tg.start_soon(probe, url)
            if len(ready) + len(refused) < len(self.urls):
                await anyio.sleep(min(0.25, max(0.0, deadline - anyio.current_time())))
        silent = [url for url in self.urls if url not in ready]
        if silent and not ready:
            raise not_ready(tuple(silent), tuple(u for u in silent if u in refused), timeout_s)
        if silent:
            _log.warning(
                "engines %s did not answer /health within %g s; going on with %s",
                ", ".join(silent),
                timeout_s,
                ", ".join(u for u in self.urls if u in ready),
            )
        return tuple(u for u in self.urls if u in ready)

    async def update_weights(
        self,
        model_path: str | os.PathLike[str] | None,
        *,
        version: str | int,
        config: WeightUpdateConfig | None = None,
        check: bool = True,
    ) -> WeightUpdateReport:
        """Update the engines to ``version`` from ``model_path``: see
        :func:`~miles_lite.engine.updates.update_engines`."""
        return await update_engines(self, model_path, version=version, config=config, check=check)

    def _engine(self, url: str) -> EngineSlot:
        try:
            return self._balancer.by_url[url]
        except KeyError:
            raise KeyError(
                f"{url!r} is not one of the router's engines {list(self._balancer.urls)}"
            ) from None

    def forget(self, key: str) -> None:
        """Drop the engine remembered for sticky ``key`` (e.g. when a session ends)."""
        self._balancer.forget(key)

    def lease(
        self, key: str | None = None, *, exclude: Collection[str] = ()
    ) -> AbstractAsyncContextManager[str]:
        """An async context manager giving the URL of the engine to use, counted in flight.

        Picks the healthy engine with the fewest leases open (ties go round robin) among
        those under ``max_inflight_per_engine``, waiting for a free slot when all are full
        (for as long as it takes: they are working). With a ``key``, the engine remembered
        for it is kept while it is healthy (waiting for its slot); otherwise the least
        loaded one is chosen and remembered. When no engine is healthy, waits for one up to
        ``wait_timeout_s``, then raises ``EngineUnavailableError`` listing the URLs (not
        retryable: the wait is over).

        When the block raises an ``EngineUnavailableError``, ``EngineTimeoutError`` or a
        502/503/504 ``EngineStatusError`` about this engine (also inside an exception
        group), a failure is recorded; ``failure_threshold`` in a row take the engine out
        of rotation. Answers to bad requests (4xx, 500) do not count. When
        it exits normally, the failure count is reset. Other errors and cancellation count
        as neither. Raises ``ClosedResourceError`` outside the router's ``async with``.

        ``exclude``: engines to avoid (one that just failed this request), unless no other
        healthy engine exists.
        """
        return _Lease(self, key, frozenset(exclude))

    async def call(
        self,
        fn: Callable[[str], Awaitable[T]],
        *,
        key: str | None = None,
        policy: RetryPolicy | None = None,
    ) -> T:
        """Await ``fn(url)`` on a leased engine, retrying retryable failures elsewhere.

        The one retry loop of requests to engines: each retry takes a new lease that avoids
        the engines that already failed this call (an engine killed mid-rollout does not
        eat every retry). ``fn`` must not retry by itself (the client's ``retry=False``).
        Only what never reached an engine and 502/503/504 answers are retried;
        ``policy`` defaults to the client's. Cancellation propagates at once.

        Through SGLang's router, ``key`` goes with the requests ``fn`` sends to it as the
        ``SmgConfig.routing_key_header`` header (see :mod:`miles_lite.engine.smg`).
        """
        # The retry loop of Router.call, written out (no closure, no lease object: it runs
        # once per request); what is retried and how long to wait is the policy's.
        policy = policy or self._client.config.retry
        balancer = self._balancer
        header = self._front.smg.routing_key_header if self._front is not None else None
        failed: frozenset[str] = _NOTHING
        attempt = 1
        while True:
            self._check_open()
            engine = balancer.take(key, failed)
            if engine is None:
                engine = await balancer.acquire(key, failed, self._check_open)
            url = engine.url
            try:
                if header is None or key is None:
                    result = await fn(url)
                else:
                    with sticky(url, header, key):
                        result = await fn(url)
            except BaseException as exc:
                # Synchronous on purpose: the in-flight count drops in a cancelled scope.
                balancer.release(engine, exc)
                delay = policy.retry_delay(attempt, exc, self._random.random)
                if delay is None:
                    raise
                failed = failed | {url}  # the next lease avoids it
            else:
                balancer.release(engine, None)
                return result
            await anyio.sleep(delay)
            attempt += 1

    async def post(
        self,
        path: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        request_id: str | None = None,
        into: BodyAllocator | None = None,
    ) -> RawResponse:
        """POST ``payload`` as JSON to ``path`` on a leased engine; the answer, unparsed.

        ``RawResponse.url`` names the engine that served it. Retried as :meth:`call` says:
        a generation the engine received is never sent again. Limits are the client's
        config. Raises what :meth:`EngineClient.post` raises, and
        ``EngineUnavailableError`` when no engine is healthy for ``wait_timeout_s``.
        """
        client = self._client

        async def send(url: str) -> RawResponse:
            return await client.post(
                url, path, payload, request_id=request_id, into=into, retry=False
            )

        return await self.call(send, key=key)

    async def post_json(
        self,
        path: str,
        payload: Any = None,
        *,
        key: str | None = None,
        request_id: str | None = None,
    ) -> Any:
        """POST ``payload`` as JSON on a leased engine; the answer parsed (``None`` if empty).

        Retried and bounded as :meth:`post`.
        """
        client = self._client

        async def send(url: str) -> Any:
            return await client.post_json(url, path, payload, request_id=request_id, retry=False)

        return await self.call(send, key=key)

    async def get_json(
        self, path: str, *, key: str | None = None, request_id: str | None = None
    ) -> Any:
        """GET ``path`` on a leased engine; the answer parsed as JSON. As :meth:`post_json`."""
        client = self._client

        async def send(url: str) -> Any:
            return await client.get_json(url, path, request_id=request_id, retry=False)

        return await self.call(send, key=key)

    async def _open(self) -> None:
        front = self._front
        if front is not None:
            await front.wait_ready()
            self._front_round(True)
        stack = AsyncExitStack()
        task_group = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._fleet.start(task_group)
        name = f"router health loop {self._describe()}"
        if front is not None:
            task_group.start_soon(front.run, self._front_round, name=name)
        else:
            task_group.start_soon(self._health.run, name=name)
        stack.callback(task_group.cancel_scope.cancel)

    def _front_round(self, ready: bool) -> None:
        """After a health round through SGLang's router: its readiness feeds the front's
        streak, and the healthy engines it lists set the front's in-flight bound."""
        front = self._front
        if front is None:
            return
        balancer = self._balancer
        self._health.rounds += 1
        balancer.record_probe(balancer.engines[0], ready)
        limit = self._config.max_inflight_per_engine * max(1, len(front.healthy_urls))
        if limit != balancer.config.max_inflight_per_engine:
            grew = limit > balancer.config.max_inflight_per_engine
            balancer.config = dataclasses.replace(self._config, max_inflight_per_engine=limit)
            if grew:
                balancer.wake_all()  # leases waiting for a slot may take the new ones

    async def _close(self) -> None:
        self._balancer.closed = True
        self._balancer.wake_all()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def _describe(self) -> str:
        urls = self._balancer.urls
        return f"router over {len(urls)} engine(s) {list(urls)}"


_NOTHING: frozenset[str] = frozenset()


class _Lease:
    """``async with router.lease(key) as url``: see :meth:`Router.lease`."""

    __slots__ = ("_engine", "_exclude", "_key", "_router")

    def __init__(self, router: Router, key: str | None, exclude: frozenset[str]) -> None:
        self._router = router
        self._key = key
        self._exclude = exclude
        self._engine: EngineSlot | None = None

    async def __aenter__(self) -> str:
        if self._engine is not None:
            raise RuntimeError("a lease can be entered only once; call router.lease() again")
        router = self._router
        self._engine = await router._balancer.acquire(self._key, self._exclude, router._check_open)
        return self._engine.url

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: the in-flight count drops even in a cancelled scope.
        if self._engine is not None:
            self._router._balancer.release(self._engine, exc)
