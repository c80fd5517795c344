"""The router: leases on engines (:mod:`~miles_lite.engine.balancer`), their health
(:mod:`~miles_lite.engine.health`), and :meth:`Router.call`, the one retry loop of
requests to engines.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from miles_lite._core.resources import AsyncResource
from miles_lite.engine._retry import retry_call
from miles_lite.engine.balancer import Balancer, EngineSlot, EngineState
from miles_lite.engine.config import RetryPolicy, RouterConfig
from miles_lite.engine.health import HealthMonitor
from miles_lite.engine.versions import WeightVersions

if TYPE_CHECKING:
    from miles_lite.engine.client import EngineClient
    from miles_lite.engine.response import BodyAllocator, RawResponse

__all__ = ["Router", "RouterStatistics"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    """A snapshot of the router: every engine's state, and how often leases had to wait.

    ``waits``: leases that found no healthy engine and waited; ``wait_timeouts``: those
    that gave up with ``EngineUnavailableError``; ``health_rounds``: probe rounds run.
    """

    engines: tuple[EngineState, ...]
    waits: int
    wait_timeouts: int
    health_rounds: int


class Router(AsyncResource):
    """Spreads requests over engines: least in flight, sticky keys, health checks.

    An async resource: entering starts the health loop in the router's own task group,
    leaving cancels it and waits for it (nothing outlives the block). Leases are refused
    (``ClosedResourceError``) outside the block. Not thread-safe; use it from one event
    loop.

    Usage::

        async with Router(urls, client, RouterConfig(max_inflight_per_engine=64)) as router:
            async with router.lease(key=session_id) as url:
                raw = await client.post(url, "/generate", payload)
    """

    _resource_name = "router"

    def __init__(self, urls: Sequence[str], client: EngineClient, config: RouterConfig) -> None:
        super().__init__()
        self._balancer = Balancer(urls, config)
        self._client = client
        self._config = config
        self._health = HealthMonitor(self._balancer, client)
        self._random = random.Random()
        self._stack: AsyncExitStack | None = None
        #: The weight versions the engines were updated to (see
        #: :class:`~miles_lite.engine.versions.WeightVersions`).
        self.versions = WeightVersions()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine's URL, in the order given."""
        return self._balancer.urls

    @property
    def healthy_urls(self) -> tuple[str, ...]:
        """The URLs of engines in rotation (healthy, and not awaiting a weight version
        they missed), in the order given."""
        return self._balancer.healthy_urls

    @property
    def capacity(self) -> int:
        """Requests the engines take at once: ``max_inflight_per_engine`` x engines."""
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
        return RouterStatistics(
            engines=tuple(engine.state() for engine in balancer.engines),
            waits=balancer.waits,
            wait_timeouts=balancer.wait_timeouts,
            health_rounds=self._health.rounds,
        )

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

    def reported_version(self, url: str, version: str | None) -> bool:
        """The engine at ``url`` reports weight ``version``: it serves again if that is the
        current version (:attr:`versions`); otherwise it awaits the current one. Returns
        whether it is clear of the version gate. ``KeyError`` for an unknown URL."""
        engine = self._engine(url)
        current = self.versions.current
        if current is None or version == current:
            self._balancer.clear_version(engine)
            return True
        self._balancer.await_version(engine, current)
        return False

    def await_version(self, url: str, version: str) -> None:
        """Take the engine at ``url`` out of rotation until it reports weight ``version``
        (it missed that update): each health round then asks its ``/model_info``, and
        :meth:`check_versions` does at once. ``KeyError`` for an unknown URL."""
        self._balancer.await_version(self._engine(url), version)

    async def check_versions(self) -> dict[str, str | None]:
        """Ask every engine that awaits a weight version for its version now (one bounded
        ``/model_info`` each, concurrently); those reporting the awaited one rejoin the
        rotation. Returns what each reported (None: no answer, or no version)."""
        waiting = [e for e in self._balancer.engines if e.awaiting_version is not None]
        found: dict[str, str | None] = {}

        async def ask(engine: EngineSlot) -> None:
            found[engine.url] = await self._health.probe_version(engine)

        async with anyio.create_task_group() as tg:
            for engine in waiting:
                tg.start_soon(ask, engine)
        return found

    def _engine(self, url: str) -> EngineSlot:
        try:
            return self._balancer.by_url[url]
        except KeyError:
            raise KeyError(
                f"{url!r} is not one of the router's engines {list(self.urls)}"
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
        """
        failed: set[str] = set()

        async def attempt() -> T:
            async with self.lease(key, exclude=failed) as url:
                try:
                    return await fn(url)
                except Exception as exc:
                    if RetryPolicy.should_retry(exc):
                        failed.add(url)
                    raise

        return await retry_call(
            policy or self._client.config.retry, attempt, rand=self._random.random
        )

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
        stack = AsyncExitStack()
        task_group = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        task_group.start_soon(self._health.run, name=f"router health loop {self._describe()}")
        stack.callback(task_group.cancel_scope.cancel)

    async def _close(self) -> None:
        self._balancer.closed = True
        self._balancer.wake_all()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def _describe(self) -> str:
        urls = self._balancer.urls
        return f"router over {len(urls)} engine(s) {list(urls)}"


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
