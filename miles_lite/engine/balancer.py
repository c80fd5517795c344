"""Choosing an engine per request: least in flight, sticky keys, a FIFO slot queue, the
failure streaks that take an engine out of rotation and let it back in, the version gate
(an engine that missed a weight update serves nothing until it reports the version) and
the hold (no lease is given while the engines' weights are being updated).

No I/O: :class:`~miles_lite.engine.router.Router` feeds it request outcomes and probe
results (:mod:`miles_lite.engine.health`) and awaits its slots.
"""

from __future__ import annotations

import sys
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import anyio

from miles_lite.engine.config import RouterConfig
from miles_lite.errors import (
    RETRYABLE_STATUSES,
    ConfigError,
    EngineError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["Balancer", "EngineSlot", "EngineState", "check_engine_url"]


@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine as the router sees it (a snapshot).

    ``healthy``: its health checks pass; ``in_flight``: leases open now;
    ``consecutive_failures``: failures since the last success; ``leases``: leases given;
    ``failures``: failures recorded (leases and probes); ``removals`` / ``readmissions``:
    times it left / rejoined for its health; ``awaiting_version``: the weight version it
    must report before it serves again (it missed that update), else None; ``checking``:
    it came back (or joined) and its stale requests and version are checked before it
    serves; ``draining``: it is being removed (no new lease). It is in rotation when
    healthy, awaiting nothing, checked and not draining.
    """

    url: str
    healthy: bool
    in_flight: int
    consecutive_failures: int
    leases: int
    failures: int
    removals: int
    readmissions: int
    awaiting_version: str | None = None
    checking: bool = False
    draining: bool = False


class EngineSlot:
    """The balancer's record of one engine (mutable; read a snapshot with :meth:`state`)."""

    __slots__ = (
        "awaiting_version",
        "checking",
        "draining",
        "failures",
        "healthy",
        "in_flight",
        "leases",
        "probe_failures",
        "readmissions",
        "removals",
        "removed_at",
        "request_failures",
        "stale_rids",
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
        self.awaiting_version: str | None = None
        #: Set when it leaves for its health (or joins): cleared by the fleet once its
        #: stale rids were aborted and its version checked.
        self.checking = False
        self.draining = False
        #: Rids whose abort it did not take (it was hung): aborted again when it answers.
        self.stale_rids: set[str] = set()

    @property
    def serving(self) -> bool:
        """In rotation: healthy, checked, not draining and not awaiting a weight version."""
        return (
            self.healthy
            and self.awaiting_version is None
            and not self.checking
            and not self.draining
        )

    @property
    def consecutive_failures(self) -> int:
        """Failures since the last success, requests and probes together."""
        return self.request_failures + self.probe_failures

    def state(self) -> EngineState:
        """A snapshot."""
        return EngineState(
            url=self.url,
            healthy=self.healthy,
            in_flight=self.in_flight,
            consecutive_failures=self.consecutive_failures,
            leases=self.leases,
            failures=self.failures,
            removals=self.removals,
            readmissions=self.readmissions,
            awaiting_version=self.awaiting_version,
            checking=self.checking,
            draining=self.draining,
        )


class Balancer:
    """Least-in-flight selection with sticky keys, per-engine slots and health streaks.

    Not thread-safe; use it from one event loop (it makes anyio events on first wait).
    """

    def __init__(self, urls: Sequence[str], config: RouterConfig) -> None:
        if isinstance(urls, str):
            raise ConfigError(f"urls must be a sequence of URLs, got the string {urls!r}")
        urls = tuple(urls)
        if not urls:
            raise ConfigError("urls must name at least one engine, got none")
        for url in urls:
            check_engine_url(url)
        duplicates = sorted({u for u in urls if urls.count(u) > 1})
        if duplicates:
            raise ConfigError(f"urls must be distinct, got duplicates {duplicates}")
        self.urls = urls
        self.config = config
        self.engines = [EngineSlot(url) for url in urls]
        self.by_url = {engine.url: engine for engine in self.engines}
        self._sticky: OrderedDict[str, EngineSlot] = OrderedDict()
        self._queue: deque[anyio.Event] = deque()  # plain leases waiting for a slot
        self._next = 0  # where the round-robin tie-break starts
        #: Set (and replaced) whenever a lease may now succeed: a slot was freed, an
        #: engine rejoined the rotation, the router closed.
        self._changed: anyio.Event | None = None
        self.waits = 0
        self.wait_timeouts = 0
        self.closed = False
        #: While set, no lease is given (a weight update runs); leases wait for it.
        self.held = False
        #: Whether an engine that left for its health is checked on its return (the
        #: fleet does it; not for SGLang's router, whose engines are its own).
        self.check_returns = True

    @property
    def healthy_urls(self) -> tuple[str, ...]:
        """The URLs of engines in rotation (healthy, no version awaited), in order."""
        return tuple(engine.url for engine in self.engines if engine.serving)

    @property
    def capacity(self) -> int:
        """Requests the engines take at once: ``max_inflight_per_engine`` x engines."""
        return self.config.max_inflight_per_engine * len(self.urls)

    def forget(self, key: str) -> None:
        """Drop the engine remembered for sticky ``key``."""
        self._sticky.pop(key, None)

    def add(self, url: str) -> EngineSlot:
        """A new engine, out of rotation until a probe passes and the fleet checked it
        (``checking``). ``ConfigError`` for a bad or known URL."""
        check_engine_url(url)
        if url in self.by_url:
            raise ConfigError(f"engine {url!r} is already one of {list(self.urls)}")
        engine = EngineSlot(url)
        engine.healthy = False
        engine.checking = True
        engine.removed_at = -float("inf")  # no cool-down for a joiner
        self.engines.append(engine)
        self.by_url[url] = engine
        self.urls = (*self.urls, url)
        return engine

    def drop(self, engine: EngineSlot) -> None:
        """Forget ``engine`` (its leases have ended): no slot, no sticky key, no URL."""
        self.engines.remove(engine)
        del self.by_url[engine.url]
        self.urls = tuple(e.url for e in self.engines)
        for key in [k for k, e in self._sticky.items() if e is engine]:
            del self._sticky[key]
        self._next = 0
        self.wake_all()

    async def changed(self) -> None:
        """Wait until a lease ends or an engine joins or leaves the rotation."""
        await self._event().wait()

    def take(self, key: str | None, exclude: Collection[str]) -> EngineSlot | None:
        """A slot now, counted in flight, when one is free and no weight update holds the
        leases; else ``None`` (then :meth:`acquire` waits for one). No await."""
        return None if self.held else self._pick(key, exclude)

    async def acquire(
        self, key: str | None, exclude: Collection[str], check: Callable[[], None]
    ) -> EngineSlot:
        """A slot on the engine for this lease (see :meth:`Router.lease`), counted in flight.

        ``check()`` raises when the router is not running; called before each wait ends.
        """
        deadline: float | None = None  # set only while no engine is healthy
        while True:
            check()
            if self.held:
                # A weight update runs: bounded by the update's own timeouts.
                await self._event().wait()
                continue
            engine = self._pick(key, exclude)
            if engine is not None:
                return engine
            if self.healthy_urls:
                # Healthy but full: wait for a slot, unbounded (the engines are working).
                deadline = None
                await self._wait_for_slot(key)
                continue
            now = anyio.current_time()
            if deadline is None:
                self.waits += 1
                deadline = now + self.config.wait_timeout_s
            with anyio.move_on_after(deadline - now):
                await self._event().wait()
            if anyio.current_time() >= deadline and not self.healthy_urls:
                self.wait_timeouts += 1
                # Not retryable: it already waited wait_timeout_s for an engine.
                behind = {e.url: e.awaiting_version for e in self.engines if e.awaiting_version}
                why = (
                    f"; out of rotation until they report a weight version: {behind}"
                    " (update their weights again)"
                    if behind
                    else "; check that they are running"
                )
                raise EngineUnavailableError(
                    f"no healthy engine among {list(self.urls)} after waiting"
                    f" {self.config.wait_timeout_s} s (wait_timeout_s){why}"
                )

    def release(self, engine: EngineSlot, exc: BaseException | None) -> None:
        """The lease on ``engine`` ended, with ``exc`` (None: it succeeded). No await."""
        engine.in_flight -= 1
        self._wake_one()  # a slot is free: one plain lease may take it
        self._set_changed()  # sticky leases check whether it is their engine's
        if exc is None:
            engine.request_failures = 0
            engine.probe_failures = 0
        elif marks_unhealthy(exc, engine.url):
            engine.request_failures += 1
            self._record_failure(engine)

    def record_probe(self, engine: EngineSlot, ok: bool) -> None:
        """A /health probe of ``engine`` passed (``ok``) or failed."""
        if not ok:
            engine.probe_failures += 1
            self._record_failure(engine)
            return
        # Only the probe streak: /health answering says nothing of generations timing out.
        engine.probe_failures = 0
        if not engine.healthy:
            cooled = anyio.current_time() - engine.removed_at
            if cooled < self.config.readmit_cooldown_s:
                return
            engine.request_failures = 0
            engine.healthy = True
            engine.readmissions += 1
            self.wake_all()

    def hold(self, held: bool) -> None:
        """Give no lease while ``held`` (a weight update runs); releasing wakes every
        waiting lease."""
        self.held = held
        if not held:
            self.wake_all()

    def await_version(self, engine: EngineSlot, version: str) -> None:
        """Take ``engine`` out of rotation until it reports ``version`` (it missed that
        update); waiting leases are woken, as when an engine leaves for its health."""
        engine.awaiting_version = version
        self.wake_all()

    def record_version(self, engine: EngineSlot, version: str | None) -> bool:
        """``engine`` reports weight ``version``: back in rotation if that is the one it
        awaited. Returns whether it awaits nothing now."""
        if version is not None and version == engine.awaiting_version:
            self.clear_version(engine)
        return engine.awaiting_version is None

    def clear_version(self, engine: EngineSlot) -> None:
        """``engine`` awaits no weight version (it took the current one)."""
        if engine.awaiting_version is not None:
            engine.awaiting_version = None
            self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiting lease (an engine rejoined or left, or the router closed)."""
        self._set_changed()
        queue, self._queue = self._queue, deque()
        for event in queue:
            event.set()

    # -- internals ---------------------------------------------------------------------

    def _event(self) -> anyio.Event:
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _set_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _record_failure(self, engine: EngineSlot) -> None:
        engine.failures += 1
        if engine.healthy and engine.consecutive_failures >= self.config.failure_threshold:
            engine.healthy = False
            # On its return: stale rids aborted, version checked (engine/fleet.py).
            engine.checking = self.check_returns
            engine.removals += 1
            engine.removed_at = anyio.current_time()
            # Leases waiting for a slot may now have no healthy engine at all: from then on
            # their wait is bounded (wait_timeout_s), and they fail together.
            self.wake_all()

    async def _wait_for_slot(self, key: str | None) -> None:
        """Sleep until a slot may be free for this lease.

        Plain leases queue first in, first out and a freed slot wakes exactly one of them
        (waking all would make N waiters re-check per release: quadratic at thousands of
        requests in flight). Sticky leases wait for their own engine and are all woken on
        any change, as are all waiters when an engine rejoins or the router closes.
        """
        if key is not None:
            await self._event().wait()
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

    def _pick(self, key: str | None, exclude: Collection[str]) -> EngineSlot | None:
        """The engine for this lease, counted in flight; None if none is free. No await.

        A sticky key whose engine is healthy but full waits for that engine. Excluded
        engines (that just failed this request) are taken only when they are the only
        healthy ones; a sticky key moves off an excluded engine.
        """
        limit = self.config.max_inflight_per_engine
        others = bool(exclude) and any(e.serving and e.url not in exclude for e in self.engines)
        avoid = exclude if others else ()
        engine = None
        if key is not None:
            engine = self._sticky.get(key)
            if engine is not None and (not engine.serving or engine.url in avoid):
                engine = None
            if engine is not None and engine.in_flight >= limit:
                return None
        if engine is None:
            engine = self._least_loaded(avoid)
            if engine is None:
                return None
        if key is not None:
            self._sticky[key] = engine
            self._sticky.move_to_end(key)
            if len(self._sticky) > self.config.max_sticky_keys:
                self._sticky.popitem(last=False)
        engine.in_flight += 1
        engine.leases += 1
        return engine

    def _least_loaded(self, exclude: Collection[str]) -> EngineSlot | None:
        best: EngineSlot | None = None
        best_index = 0
        count = len(self.engines)
        limit = self.config.max_inflight_per_engine
        # Scan from the round-robin cursor so that ties go to each engine in turn.
        for step in range(count):
            index = (self._next + step) % count
            engine = self.engines[index]
            if (
                engine.serving
                and engine.url not in exclude
                and engine.in_flight < limit
                and (best is None or engine.in_flight < best.in_flight)
            ):
                best, best_index = engine, index
        if best is not None:
            self._next = (best_index + 1) % count
        return best


def check_engine_url(url: object) -> None:
    """Refuse an engine URL the client could not reach: not a string, no ``http://`` or
    ``https://`` scheme, no host, a host or port that does not parse (``http://::zz``,
    ``http://h:99999``). ``ConfigError`` saying the fix (``127.0.0.1:30000`` ->
    ``http://127.0.0.1:30000``), so a typo fails when the rollout opens, not as a
    malformed answer on every sample."""
    if not isinstance(url, str):
        raise ConfigError(f"an engine URL must be a str like 'http://host:port', got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # parsed on access: a bad port, or an IPv6 host without brackets
    except ValueError as exc:
        raise ConfigError(
            f"engine URL {url!r}: the host and port do not parse ({exc}); write"
            " http://host:port (an IPv6 host in brackets: http://[::1]:30000)"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        fix = "http://" + url.split("://", 1)[-1].lstrip("/")
        raise ConfigError(
            f"engine URL {url!r} needs an http:// or https:// scheme and a host: write {fix!r}"
        )


def marks_unhealthy(exc: BaseException, url: str) -> bool:
    """Whether ``exc`` says that the engine at ``url`` is failing: it cannot be reached, it
    timed out, or it answered 502/503/504 (overloaded, starting, behind a failing proxy).

    An answer to a bad request does not count: a 4xx, or a 500 SGLang raises for a body
    it cannot handle (one agent's requests must not take a shared engine out of rotation
    for everyone); nor does an error about another engine. Looks inside exception groups.
    """
    if isinstance(exc, BaseExceptionGroup):
        return any(marks_unhealthy(inner, url) for inner in exc.exceptions)
    if not isinstance(exc, EngineError) or exc.url not in (None, url):
        return False
    if isinstance(exc, EngineStatusError):
        return exc.status in RETRYABLE_STATUSES
    return isinstance(exc, EngineUnavailableError | EngineTimeoutError)
