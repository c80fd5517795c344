"""Choosing an engine per request: least in flight, sticky keys, health checks, re-admission.

Like miles' router, an engine that fails ``failure_threshold`` times in a row leaves the
rotation. Unlike it, the health loop keeps probing removed engines and re-admits one once
its ``/health`` answers 2xx after ``readmit_cooldown_s`` (an engine restarted after a crash
comes back by itself). A passing probe does not clear request failures: an engine whose
``/health`` answers while its generations time out still leaves the rotation, and is let
back only after the cool-down, so it cannot flap in and out every probe round.
"""

from __future__ import annotations

import random
import sys
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from miles_lite.engine.retry import RetryPolicy, retry_call
from miles_lite.errors import (
    ClosedResourceError,
    ConfigError,
    EngineError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from miles_lite.engine.client import EngineClient
    from miles_lite.engine.response import BodyAllocator, RawResponse

__all__ = ["EngineState", "Router", "RouterConfig", "RouterStats"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterConfig:
    """How the router checks engine health and how long a lease may wait (seconds).

    Raises :class:`~miles_lite.errors.ConfigError` naming the field on a bad value.

    Usage: ``RouterConfig(health_interval_s=2.0, failure_threshold=3)``.
    """

    #: Time between two rounds of /health probes (every engine, removed ones included).
    health_interval_s: float = 5.0
    #: Consecutive failures (of leases or probes) that take an engine out of rotation.
    failure_threshold: int = 3
    #: Longest wait for one /health answer; no answer in time counts as a failure.
    health_timeout_s: float = 2.0
    #: Longest wait in :meth:`Router.lease` for a healthy engine when none is.
    wait_timeout_s: float = 60.0
    #: Sticky keys remembered (least recently used ones are forgotten first).
    max_sticky_keys: int = 100_000
    #: Leases open at once on one engine, whoever holds them (every rollout sharing this
    #: router): a lease waits for a free slot. When an engine leaves the rotation, the
    #: others do not take its share. For SGLang, about its ``--max-running-requests``
    #: (plus a queued request or two, so the engine never idles between answers).
    max_inflight_per_engine: int = 4
    #: Least time out of rotation before a passing /health probe lets an engine back in
    #: (seconds, >= 0). Counted from its removal.
    readmit_cooldown_s: float = 10.0

    def __post_init__(self) -> None:
        value = self.readmit_cooldown_s
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < float("inf")
        ):
            raise ConfigError(
                f"readmit_cooldown_s must be a finite number of seconds >= 0, got {value!r}"
            )
        for name in ("health_interval_s", "health_timeout_s", "wait_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < float("inf")
            ):
                raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        for name in ("failure_threshold", "max_sticky_keys", "max_inflight_per_engine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine as the router sees it (a snapshot).

    ``healthy``: in rotation; ``in_flight``: leases open now; ``consecutive_failures``:
    failures since the last success; ``leases``: leases given; ``failures``: failures
    recorded (leases and probes); ``removals`` / ``readmissions``: times it left / rejoined.
    """

    url: str
    healthy: bool
    in_flight: int
    consecutive_failures: int
    leases: int
    failures: int
    removals: int
    readmissions: int


@dataclass(frozen=True, slots=True)
class RouterStats:
    """A snapshot of the router: every engine's state, and how often leases had to wait.

    ``waits``: leases that found no healthy engine and waited; ``wait_timeouts``: those
    that gave up with ``EngineUnavailableError``; ``health_rounds``: probe rounds run.
    """

    engines: tuple[EngineState, ...]
    waits: int
    wait_timeouts: int
    health_rounds: int


class _Engine:
    __slots__ = (
        "failures",
        "healthy",
        "in_flight",
        "leases",
        "probe_failures",
        "readmissions",
        "removals",
        "removed_at",
        "request_failures",
        "url",
    )

    def __init__(self, url: str) -> None:
        self.url = url
        self.healthy = True
        self.in_flight = 0
        # Two streaks: a passing probe clears only its own, a request that succeeds both.
        self.request_failures = 0
        self.probe_failures = 0
        self.removed_at = 0.0
        self.leases = 0
        self.failures = 0
        self.removals = 0
        self.readmissions = 0

    @property
    def consecutive_failures(self) -> int:
        return self.request_failures + self.probe_failures

    def snapshot(self) -> EngineState:
        return EngineState(
            url=self.url,
            healthy=self.healthy,
            in_flight=self.in_flight,
            consecutive_failures=self.consecutive_failures,
            leases=self.leases,
            failures=self.failures,
            removals=self.removals,
            readmissions=self.readmissions,
        )


class Router:
    """Spreads requests over engines: least in flight, sticky keys, health checks.

    An async context manager: entering starts the health loop in the router's own task
    group, leaving cancels it and waits for it (nothing outlives the block). Leases are
    refused (``ClosedResourceError``) outside the block. Not thread-safe; use it from one
    event loop.

    Usage::

        async with Router(urls, client, RouterConfig()) as router:
            async with router.lease(key=session_id) as url:
                raw = await client.post(url, "/generate", payload)
    """

    #: Set (and replaced) whenever a lease may now succeed: a slot was freed, an engine
    #: rejoined the rotation, the router closed. Made on entering: an anyio.Event needs the
    #: running event loop. Used only while running.
    _changed: anyio.Event

    def __init__(
        self, urls: Sequence[str], client: EngineClient, config: RouterConfig | None = None
    ) -> None:
        if isinstance(urls, str):
            raise ConfigError(f"urls must be a sequence of URLs, got the string {urls!r}")
        urls = tuple(urls)
        if not urls:
            raise ConfigError("urls must name at least one engine, got none")
        duplicates = sorted({u for u in urls if urls.count(u) > 1})
        if duplicates:
            raise ConfigError(f"urls must be distinct, got duplicates {duplicates}")
        self._urls = urls
        self._engines = [_Engine(url) for url in urls]
        self._by_url = {engine.url: engine for engine in self._engines}
        self._client = client
        self._config = config if config is not None else RouterConfig()
        self._sticky: OrderedDict[str, _Engine] = OrderedDict()
        self._queue: deque[anyio.Event] = deque()  # plain leases waiting for a slot
        self._random = random.Random()
        self._next = 0  # where the round-robin tie-break starts
        self._task_group: TaskGroup | None = None
        self._state = "new"  # -> "running" -> "closed"
        self._waits = 0
        self._wait_timeouts = 0
        self._health_rounds = 0

    @property
    def urls(self) -> tuple[str, ...]:
        """Every engine's URL, in the order given."""
        return self._urls

    @property
    def healthy_urls(self) -> tuple[str, ...]:
        """The URLs of engines in rotation, in the order given."""
        return tuple(engine.url for engine in self._engines if engine.healthy)

    @property
    def capacity(self) -> int:
        """Requests the engines take at once: ``max_inflight_per_engine`` x engines."""
        return self._config.max_inflight_per_engine * len(self._urls)

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

    def stats(self) -> RouterStats:
        """A snapshot of every engine's state and of the lease waits."""
        return RouterStats(
            engines=tuple(engine.snapshot() for engine in self._engines),
            waits=self._waits,
            wait_timeouts=self._wait_timeouts,
            health_rounds=self._health_rounds,
        )

    def forget(self, key: str) -> None:
        """Drop the engine remembered for sticky ``key`` (e.g. when a session ends)."""
        self._sticky.pop(key, None)

    def lease(
        self, key: str | None = None, *, exclude: Collection[str] = ()
    ) -> AbstractAsyncContextManager[str]:
        """An async context manager giving the URL of the engine to use, counted in flight.

        Picks the healthy engine with the fewest leases open (ties go round robin) among
        those under ``max_inflight_per_engine``, waiting for a free slot when all are full
        (for as long as it takes: they are working). With a ``key``, the engine remembered
        for it is kept while it is healthy (waiting for its slot); otherwise the least
        loaded one is chosen and remembered. When no engine is healthy, waits for one up to
        ``wait_timeout_s``, then raises ``EngineUnavailableError`` listing the URLs.

        When the block raises an ``EngineUnavailableError``, ``EngineTimeoutError`` or 5xx
        ``EngineStatusError`` about this engine (also inside an exception group), a failure
        is recorded; ``failure_threshold`` in a row take the engine out of rotation. When
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

        The one retry loop of requests through the router: each retry takes a new lease
        that avoids the engines that already failed this call (an engine killed mid-rollout
        does not eat every retry). ``fn`` must not retry by itself (the client's
        ``retry=False``). Only what never reached an engine and 502/503/504 answers are
        retried (see :mod:`miles_lite.engine.retry`); ``policy`` defaults to the client's.
        Cancellation propagates at once.
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

        ``RawResponse.url`` names the engine that served it (for an abort or a sticky
        follow-up). Retried as :meth:`call` says: only what never reached an engine and
        502/503/504, each retry on another engine when there is one; a generation the
        engine received is never sent again. Limits are the client's config
        (``total_timeout_s``, ``read_timeout_s``, ``max_body_bytes``). Raises what
        :meth:`EngineClient.post` raises, and ``EngineUnavailableError`` when no engine is
        healthy for ``wait_timeout_s``.
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

        Retried and bounded as :meth:`post`. Use :meth:`post` when the engine that served
        matters (``RawResponse.url``); this returns only the parsed body.
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

    async def __aenter__(self) -> Router:
        if self._state != "new":
            raise ClosedResourceError(
                f"router {self._describe()} was already started; make a new Router"
            )
        self._changed = anyio.Event()
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._state = "running"
        task_group.start_soon(self._health_loop, name=f"router health loop {self._describe()}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group, self._task_group = self._task_group, None
        self._state = "closed"
        self._wake_waiters()
        if task_group is None:  # __aenter__ failed before the task group existed
            return None
        task_group.cancel_scope.cancel()
        if isinstance(exc, Exception):
            # The caller's own error is not the task group's: given to it, anyio would wrap
            # it in an ExceptionGroup. Wait for the health loop, then let the error through.
            await task_group.__aexit__(None, None, None)
            return None
        return await task_group.__aexit__(exc_type, exc, tb)

    # -- selection ---------------------------------------------------------------------

    async def _acquire(self, key: str | None, exclude: frozenset[str] = frozenset()) -> _Engine:
        self._check_running()
        deadline: float | None = None  # set only while no engine is healthy
        while True:
            engine = self._pick(key, exclude)
            if engine is not None:
                return engine
            if self.healthy_urls:
                # Healthy but full: wait for a slot, unbounded (the engines are working).
                deadline = None
                await self._wait_for_slot(key)
            else:
                now = anyio.current_time()
                if deadline is None:
                    self._waits += 1
                    deadline = now + self._config.wait_timeout_s
                with anyio.move_on_after(deadline - now):
                    await self._changed.wait()
                if anyio.current_time() >= deadline and not self.healthy_urls:
                    self._wait_timeouts += 1
                    raise EngineUnavailableError(
                        f"no healthy engine among {list(self._urls)} after waiting"
                        f" {self._config.wait_timeout_s} s (wait_timeout_s); check that they"
                        " are running"
                    )
            self._check_running()

    async def _wait_for_slot(self, key: str | None) -> None:
        """Sleep until a slot may be free for this lease.

        Plain leases queue first in, first out and a freed slot wakes exactly one of them
        (waking all would make N waiters re-check per release: quadratic at thousands of
        requests in flight). Sticky leases wait for their own engine and are all woken on
        any change, as are all waiters when an engine rejoins or the router closes.
        """
        if key is not None:
            await self._changed.wait()
            return
        event = anyio.Event()
        self._queue.append(event)
        try:
            await event.wait()
        except BaseException:
            if event in self._queue:
                self._queue.remove(event)
            elif event.is_set():
                self._wake_one()  # woken for a slot we will not take: pass it on
            raise

    def _wake_one(self) -> None:
        while self._queue:
            event = self._queue.popleft()
            if not event.is_set():
                event.set()
                return

    def _pick(self, key: str | None, exclude: frozenset[str] = frozenset()) -> _Engine | None:
        """The engine for this lease, counted in flight; None if none is free. No await.

        A sticky key whose engine is healthy but full waits for that engine. Excluded
        engines are taken only when they are the only healthy ones.
        """
        engine = None
        if key is not None:
            engine = self._sticky.get(key)
            if engine is not None and not engine.healthy:
                engine = None
            if engine is not None and engine.in_flight >= self._config.max_inflight_per_engine:
                return None
        if engine is None:
            others = exclude and any(e.healthy and e.url not in exclude for e in self._engines)
            engine = self._least_loaded(exclude if others else frozenset())
            if engine is None:
                return None
        if key is not None:
            self._sticky[key] = engine
            self._sticky.move_to_end(key)
            if len(self._sticky) > self._config.max_sticky_keys:
                self._sticky.popitem(last=False)
        engine.in_flight += 1
        engine.leases += 1
        return engine

    def _least_loaded(self, exclude: frozenset[str]) -> _Engine | None:
        best: _Engine | None = None
        best_index = 0
        count = len(self._engines)
        # Scan from the round-robin cursor so that ties go to each engine in turn.
        for step in range(count):
            index = (self._next + step) % count
            engine = self._engines[index]
            if (
                engine.healthy
                and engine.url not in exclude
                and engine.in_flight < self._config.max_inflight_per_engine
                and (best is None or engine.in_flight < best.in_flight)
            ):
                best, best_index = engine, index
        if best is not None:
            self._next = (best_index + 1) % count
        return best

    def _release(self, engine: _Engine, exc: BaseException | None) -> None:
        engine.in_flight -= 1
        self._wake_one()  # a slot is free: one plain lease may take it
        self._changed.set()  # sticky leases check whether it is their engine's
        self._changed = anyio.Event()
        if exc is None:
            engine.request_failures = 0
            engine.probe_failures = 0
        elif _marks_unhealthy(exc, engine.url):
            engine.request_failures += 1
            self._record_failure(engine)

    # -- health ------------------------------------------------------------------------

    def _record_failure(self, engine: _Engine) -> None:
        engine.failures += 1
        if engine.healthy and engine.consecutive_failures >= self._config.failure_threshold:
            engine.healthy = False
            engine.removals += 1
            engine.removed_at = anyio.current_time()
            # Leases waiting for a slot may now have no healthy engine at all: from then on
            # their wait is bounded (wait_timeout_s), and they fail together.
            self._wake_waiters()

    def _record_probe(self, engine: _Engine, ok: bool) -> None:
        if not ok:
            engine.probe_failures += 1
            self._record_failure(engine)
            return
        # Only the probe streak: /health answering says nothing of generations timing out.
        engine.probe_failures = 0
        if not engine.healthy:
            cooled = anyio.current_time() - engine.removed_at
            if cooled < self._config.readmit_cooldown_s:
                return
            engine.request_failures = 0
            engine.healthy = True
            engine.readmissions += 1
            self._wake_waiters()

    async def _health_loop(self) -> None:
        while True:
            async with anyio.create_task_group() as task_group:
                for engine in self._engines:
                    task_group.start_soon(self._probe, engine)
            self._health_rounds += 1
            await anyio.sleep(self._config.health_interval_s)

    async def _probe(self, engine: _Engine) -> None:
        timeout_s = self._config.health_timeout_s
        ok = False
        with anyio.move_on_after(timeout_s):
            ok = await self._client.health(engine.url, timeout_s=timeout_s)
        self._record_probe(engine, ok)

    # -- helpers -----------------------------------------------------------------------

    def _wake_waiters(self) -> None:
        """Wake every waiting lease (an engine rejoined or left, or the router closed)."""
        self._changed.set()
        self._changed = anyio.Event()
        queue, self._queue = self._queue, deque()
        for event in queue:
            event.set()

    def _check_running(self) -> None:
        if self._state == "new":
            raise ClosedResourceError(
                f"router {self._describe()} is not running: enter it with `async with` first"
            )
        if self._state == "closed":
            raise ClosedResourceError(
                f"router {self._describe()} is closed: its `async with` has ended"
            )

    def _engine(self, url: str) -> _Engine:
        try:
            return self._by_url[url]
        except KeyError:
            raise KeyError(
                f"{url!r} is not one of the router's engines {list(self._urls)}"
            ) from None

    def _describe(self) -> str:
        return f"over {len(self._urls)} engine(s) {list(self._urls)}"


class _Lease:
    """``async with router.lease(key) as url``: see :meth:`Router.lease`."""

    __slots__ = ("_engine", "_exclude", "_key", "_router")

    def __init__(self, router: Router, key: str | None, exclude: frozenset[str]) -> None:
        self._router = router
        self._key = key
        self._exclude = exclude
        self._engine: _Engine | None = None

    async def __aenter__(self) -> str:
        if self._engine is not None:
            raise RuntimeError("a lease can be entered only once; call router.lease() again")
        self._engine = await self._router._acquire(self._key, self._exclude)
        return self._engine.url

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous on purpose: the in-flight count drops even in a cancelled scope.
        if self._engine is not None:
            self._router._release(self._engine, exc)


def _marks_unhealthy(exc: BaseException, url: str) -> bool:
    """Whether ``exc`` says that the engine at ``url`` is failing (down, slow or 5xx)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_marks_unhealthy(inner, url) for inner in exc.exceptions)
    if not isinstance(exc, EngineError) or exc.url not in (None, url):
        return False
    if isinstance(exc, EngineStatusError):
        return exc.status >= 500
    return isinstance(exc, EngineUnavailableError | EngineTimeoutError)
