"""The fleet: engines that join, leave, die, hang and come back while a rollout runs, and
the weight fence that keeps each one out of rotation until it serves the current weights.

Behind SGLang's router, an engine on other weights is taken off smg's worker list while
it is caught up, then registered again (:meth:`Fleet.fence_worker`). A catch-up that
keeps failing from one source gives up after ``RouterConfig.max_catch_up_tries``.

The router owns one :class:`Fleet`. It remembers the current weights' source (the path
and version of the last successful update, :class:`WeightSource`). An engine is out of
rotation (:attr:`EngineSlot.serving <miles_lite.engine.balancer.EngineSlot.serving>`)
while:

- it awaits a weight version (it missed an update, or came back or joined on other
  weights): the fleet brings it up to date itself, from the remembered source, with
  backoff (pause ``retract``, load, flush, continue, read ``/model_info``), and lets it
  back only once ``/model_info`` reports the current version;
- it is being checked (``checking``): it left for its health (dead, hung) or just
  joined; when its ``/health`` passes again, the aborts it did not take while hung are
  sent again, and its version is read: the current one lets it back, another fences it;
- it is draining (:meth:`Fleet.remove`): no new lease, the leases it has end, then it is
  forgotten.

Every transition is counted (:class:`FleetStatistics`, in ``Router.statistics()``) and
logged. No request is ever sent to an engine that is not serving, so none reaches an
engine before it reported the current version (once there is one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from miles_lite.engine.balancer import Balancer, EngineSlot
from miles_lite.engine.cache_control import flush_cache
from miles_lite.engine.control import (
    abort_requests,
    continue_generation,
    pause_generation,
    read_weight_versions,
    update_weights_from_disk,
)
from miles_lite.engine.versions import WeightVersions
from miles_lite.errors import EngineError
from miles_lite.sglang.control import MODEL_INFO_PATH, PauseMode, model_info_version

if TYPE_CHECKING:
    from miles_lite.engine.http.client import EngineClient
    from miles_lite.engine.smg import SmgFront

__all__ = ["Fleet", "FleetStatistics", "WeightSource"]

_log = logging.getLogger(__name__)

#: Stale rids an engine keeps for its return (beyond: abort_all there instead).
_MAX_STALE_RIDS = 4096


@dataclass(frozen=True, slots=True)
class WeightSource:
    """Where the current weights came from: ``path`` (None: the trainer pushed them
    itself, so no engine can be caught up from a folder), ``version``, and how the update
    loaded and flushed (``load_timeout_s``, ``control_timeout_s``, ``flush_timeout_s``,
    ``flushes``)."""

    path: str | None
    version: str
    load_timeout_s: float = 300.0
    control_timeout_s: float = 10.0
    flush_timeout_s: float = 30.0
    flushes: bool = True


@dataclass(frozen=True, slots=True)
class FleetStatistics:
    """The fleet's transitions, counted since the router opened.

    ``fenced``: engines taken out of rotation for their weight version; ``checked``:
    returns (or joins) checked; ``readmitted``: engines let back at the current version;
    ``catch_ups`` / ``catch_up_failures``: catch-up updates that brought an engine to the
    current version / that did not; ``catch_up_gave_up``: catch-ups given up after
    ``RouterConfig.max_catch_up_tries`` failed tries from one source (the engine stays
    out until the next update or its next return); ``stale_aborts``: rids aborted at an engine that
    came back; ``joined`` / ``removed``: engines added / forgotten; ``aborted_on_remove``:
    removals without drain.
    """

    fenced: int = 0
    checked: int = 0
    readmitted: int = 0
    catch_ups: int = 0
    catch_up_failures: int = 0
    stale_aborts: int = 0
    joined: int = 0
    removed: int = 0
    aborted_on_remove: int = 0
    catch_up_gave_up: int = 0

    def metrics_since(self, before: FleetStatistics) -> dict[str, float]:
        """The transitions since ``before`` as rollout metrics: ``fleet/<count>`` for
        each count (0 included), the delta over a run."""
        return {
            f"fleet/{name}": float(getattr(self, name) - getattr(before, name))
            for name in FleetStatistics.__slots__
        }


class Fleet:
    """The weight fence, catch-up, stale aborts, joins and removals (see the module doc).

    ``backoff_s``: the first wait after a failed catch-up (doubling up to
    ``max_backoff_s``). Catch-ups run in the task group given to :meth:`start`.
    """

    def __init__(
        self,
        balancer: Balancer,
        client: EngineClient,
        versions: WeightVersions,
        *,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._balancer = balancer
        self._client = client
        self._versions = versions
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._tg: anyio.abc.TaskGroup | None = None
        self._catching: set[str] = set()  # catch-up tasks running
        # Of those, pushing weights right now: each try's end (set when it ended).
        self._updating: dict[str, anyio.Event] = {}
        #: Engines whose catch-up from a source was given up (the source's version).
        self._gave_up: dict[str, WeightSource] = {}
        self._counts: dict[str, int] = dict.fromkeys(FleetStatistics.__slots__, 0)
        #: The last successful update's source; None before any.
        self.source: WeightSource | None = None

    def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Run catch-ups in ``task_group`` (the router's, cancelled when it closes)."""
        self._tg = task_group

    def statistics(self) -> FleetStatistics:
        """A snapshot of the counts."""
        return FleetStatistics(**self._counts)

    def _count(self, name: str, n: int = 1) -> None:
        self._counts[name] += n

    # -- the fence -----------------------------------------------------------------------

    def fence(self, engine: EngineSlot, version: str, why: str) -> None:
        """Take ``engine`` out of rotation until it reports ``version``; the catch-up
        starts at once when the router runs (and its health passes)."""
        if engine.awaiting_version != version:
            self._count("fenced")
            _log.warning(
                "engine %s out of rotation until it reports %r: %s", engine.url, version, why
            )
        self._balancer.await_version(engine, version)
        if engine.healthy and not engine.checking:
            self._spawn_catch_up(engine)

    def admit(self, engine: EngineSlot, version: str | None) -> None:
        """``engine`` reports ``version``, the current one: back in rotation."""
        was_out = engine.awaiting_version is not None or engine.checking
        engine.checking = False
        self._balancer.clear_version(engine)
        self._balancer.wake_all()
        if was_out and engine.serving:
            self._count("readmitted")
            _log.info("engine %s back in rotation at weight version %r", engine.url, version)

    def reported(self, engine: EngineSlot, version: str | None) -> bool:
        """``engine`` reports ``version`` (None: it did not say): admitted if it is the
        current one (or none is recorded), else fenced. Whether it is clear now."""
        current = self._versions.current
        if current is None or version == current:
            self.admit(engine, version)
            return True
        self.fence(engine, current, f"it reports weight version {version!r}")
        return False

    async def read_version(self, engine: EngineSlot) -> str | None:
        """``engine``'s ``/model_info`` weight version (one bounded attempt); None when it
        did not say."""
        return await self.read_url_version(engine.url)

    async def read_url_version(self, url: str) -> str | None:
        """The ``/model_info`` weight version of the engine at ``url`` (one bounded
        attempt); None when it did not say."""
        timeout_s = self._balancer.config.health_timeout_s
        with anyio.move_on_after(timeout_s):
            try:
                info = await self._client.get_json(
                    url, MODEL_INFO_PATH, timeout_s=timeout_s, retry=False, control=True
                )
            except EngineError:
                return None
            return model_info_version(info)
        return None

    async def check(self, engine: EngineSlot, *, settle: bool = False) -> str | None:
        """After a passing probe of an engine out of rotation for its weights or its
        return: abort what it owes, read its version, admit or fence it (and start its
        catch-up). The version it reported, or None.

        An engine a catch-up is loading weights into is left to it (a version read
        mid-load can come before the cache flush); ``settle`` waits for that try to end
        first (also for one that started while the version was read, which is then read
        again), so that what the engine reports then decides at once."""
        while True:
            trying = self._updating.get(engine.url) if settle else None
            if trying is not None:
                await trying.wait()
            version = await self.read_version(engine)
            if not settle or engine.url not in self._updating:
                break
        if engine.url not in self._balancer.by_url or engine.draining:
            return version
        if version is None and (self._versions.current is not None or not engine.checking):
            return version  # it must say its version before it serves again
        if engine.checking:
            self._count("checked")
            self._gave_up.pop(engine.url, None)  # back from a death or hang: tries anew
            await self._abort_stale(engine)
            current = self._versions.current
            if current is None or version == current:
                self.admit(engine, version)  # clears checking, counts the readmission
            else:
                engine.checking = False
                self.fence(engine, current, f"it came back reporting weight version {version!r}")
        elif engine.awaiting_version is not None and engine.url not in self._updating:
            # (A catch-up pushing weights admits the engine itself, once its cache was
            # flushed; between its tries, an engine brought up to date some other way
            # comes back here, and the catch-up ends.)
            if version == engine.awaiting_version:
                self.admit(engine, version)
            else:
                self._spawn_catch_up(engine)
        return version

    async def _abort_stale(self, engine: EngineSlot) -> None:
        """Send again the aborts ``engine`` did not take while it was hung."""
        rids, engine.stale_rids = engine.stale_rids, set()
        if not rids:
            return
        report = await abort_requests(
            self._client,
            {engine.url: sorted(rids)},
            timeout_s=self._balancer.config.health_timeout_s,
            settle_timeout_s=self._balancer.config.health_timeout_s,
        )
        self._count("stale_aborts", len(rids))
        _log.warning(
            "engine %s answers again: aborted %d stale request(s) (%s)",
            engine.url,
            len(rids),
            report.engines[0].error or "idle",
        )

    def owe_abort(self, engine: EngineSlot, rid: str) -> None:
        """``engine`` did not take the abort of ``rid`` (hung, gone): it is sent again
        when the engine answers (:meth:`check`)."""
        if len(engine.stale_rids) < _MAX_STALE_RIDS:
            engine.stale_rids.add(rid)

    # -- catch-up ------------------------------------------------------------------------

    def _spawn_catch_up(self, engine: EngineSlot) -> None:
        source = self.source
        if self._tg is None or engine.url in self._catching:
            return
        if source is not None and self._gave_up.get(engine.url) is source:
            return  # given up on this source: the next update or return tries again
        if source is None or source.path is None or source.version != engine.awaiting_version:
            if source is not None and source.path is None:
                _log.warning(
                    "engine %s awaits weight version %r, pushed by the trainer (no folder):"
                    " it stays out until an update reaches it",
                    engine.url,
                    engine.awaiting_version,
                )
            return
        self._catching.add(engine.url)
        self._tg.start_soon(self._catch_up, engine, source, name=f"catch-up {engine.url}")

    async def _catch_up(self, engine: EngineSlot, source: WeightSource) -> None:
        """Update ``engine`` from ``source`` until it reports its version (backoff between
        tries), as long as that is still the version it awaits."""
        delay = self._backoff_s
        tries = self._balancer.config.max_catch_up_tries
        failed = 0
        try:
            while (
                engine.awaiting_version == source.version
                and self.source is source
                and engine.url in self._balancer.by_url
                and not engine.draining
            ):
                if engine.healthy:
                    trying = self._updating[engine.url] = anyio.Event()
                    try:
                        version, why = await self._update_one(engine, source)
                    finally:
                        del self._updating[engine.url]
                        trying.set()
                    if version == source.version:
                        self._count("catch_ups")
                        _log.info("engine %s caught up to %r", engine.url, version)
                        self.admit(engine, version)
                        return
                    self._count("catch_up_failures")
                    failed += 1
                    if failed >= tries:
                        self._gave_up[engine.url] = source
                        self._count("catch_up_gave_up")
                        _log.error(
                            "catch-up of engine %s to %r from %s gave up after %d failed"
                            " tries (last: %s): it stays out of rotation until the next"
                            " update or its next return",
                            engine.url,
                            source.version,
                            source.path,
                            failed,
                            why,
                        )
                        return
                    _log.warning(
                        "catch-up of engine %s to %r from %s failed (%s); again in %g s",
                        engine.url,
                        source.version,
                        source.path,
                        why,
                        delay,
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, self._max_backoff_s)
        finally:
            self._catching.discard(engine.url)

    async def _update_one(self, engine: EngineSlot, source: WeightSource) -> tuple[str | None, str]:
        """One catch-up of ``engine`` (paused only while requests of ours are still at
        it): see :meth:`_update_url`."""
        return await self._update_url(engine.url, source, paused=engine.in_flight > 0)

    async def _update_url(
        self, url: str, source: WeightSource, *, paused: bool
    ) -> tuple[str | None, str]:
        """One catch-up of the engine at ``url``: pause (retract, if ``paused``), load,
        flush, continue (shielded), read. Its version after, and why it failed ('' if it
        did not)."""
        assert source.path is not None
        client, urls, control_s = self._client, [url], source.control_timeout_s
        why = ""
        try:
            if paused:
                await pause_generation(client, urls, PauseMode.RETRACT, timeout_s=control_s)
            push = await update_weights_from_disk(
                client, urls, source.path, version=source.version, timeout_s=source.load_timeout_s
            )
            if not push.ok:
                why = str(push.engines[0].error)
            elif source.flushes:
                flushed = await flush_cache(client, urls, timeout_s=source.flush_timeout_s)
                if not flushed.ok:
                    why = str(flushed.engines[0].error)
        finally:
            if paused:
                with anyio.CancelScope(shield=True):
                    await continue_generation(client, urls, timeout_s=control_s)
        if why:
            return None, why
        read = await read_weight_versions(client, urls, timeout_s=control_s)
        version = read.engines[0].version
        return version, "" if version == source.version else f"reports {version!r}"

    # -- behind SGLang's router ------------------------------------------------------------

    def fence_worker(self, front: SmgFront, url: str, version: str, why: str) -> None:
        """The engine at ``url`` behind smg does not serve ``version``: take it off smg's
        worker list (smg then routes it nothing new; what it holds goes on), catch it up
        from the last update's source (backoff, at most ``max_catch_up_tries``), and
        register it with smg again once it reports ``version``. Without a folder to catch
        up from, it is only logged (it stays at smg)."""
        source = self.source
        if self._tg is None or url in self._catching:
            return
        self._count("fenced")
        if source is None or source.path is None or source.version != version:
            _log.warning(
                "engine %s behind SGLang's router reports another weight version than %r"
                " (%s) and there is no folder to catch it up from: smg keeps routing to it",
                url,
                version,
                why,
            )
            return
        _log.warning(
            "engine %s behind SGLang's router off smg until it reports %r: %s", url, version, why
        )
        self._catching.add(url)
        self._tg.start_soon(self._catch_up_worker, front, url, source, name=f"catch-up {url}")

    async def _catch_up_worker(self, front: SmgFront, url: str, source: WeightSource) -> None:
        delay = self._backoff_s
        tries = self._balancer.config.max_catch_up_tries
        try:
            try:
                await front.remove_worker(url)
            except (EngineError, TimeoutError) as exc:
                _log.error("could not take engine %s off smg at %s: %s", url, front.url, exc)
            for attempt in range(1, tries + 1):
                if self.source is not source and self.source is not None:
                    # A newer update (smg no longer lists it: it did not reach it).
                    source = self.source
                    if source.path is None:
                        _log.error(
                            "engine %s is off smg and the current weights %r were pushed"
                            " by the trainer (no folder): add it back once it serves them",
                            url,
                            source.version,
                        )
                        return
                assert source.path is not None
                version, why = await self._update_url(url, source, paused=True)
                if version == source.version:
                    self._count("catch_ups")
                    try:
                        await front.add_worker(url)
                    except EngineError as exc:
                        _log.error("could not add engine %s back to smg: %s", url, exc)
                        return
                    self._count("readmitted")
                    _log.info("engine %s caught up to %r, back at smg", url, version)
                    return
                self._count("catch_up_failures")
                _log.warning("catch-up of engine %s to %r failed (%s)", url, source.version, why)
                if attempt < tries:
                    await anyio.sleep(delay)
                    delay = min(delay * 2, self._max_backoff_s)
            self._count("catch_up_gave_up")
            _log.error(
                "catch-up of engine %s to %r from %s gave up after %d failed tries: it stays"
                " off smg",
                url,
                source.version,
                source.path,
                tries,
            )
        finally:
            self._catching.discard(url)

    # -- joins and removals --------------------------------------------------------------

    async def add(self, url: str) -> bool:
        """A new engine: probed, checked (its version read, fenced and caught up when it is
        not the current one) and only then routed to. Whether it serves now (else the
        health loop and its catch-up go on)."""
        engine = self._balancer.add(url)
        self._count("joined")
        _log.info("engine %s joins", url)
        timeout_s = self._balancer.config.health_timeout_s
        ok = False
        with anyio.move_on_after(timeout_s):
            ok = await self._client.health(url, timeout_s=timeout_s)
        self._balancer.record_probe(engine, ok)
        if ok:
            await self.check(engine)
        return engine.serving

    async def remove(self, engine: EngineSlot, *, drain: bool, abort_timeout_s: float) -> None:
        """No new lease on ``engine``; with ``drain`` its leases end by themselves, else
        its requests are aborted (they answer with their partial output); then it is
        forgotten."""
        engine.draining = True
        self._balancer.wake_all()
        _log.info("engine %s leaves (%s)", engine.url, "draining" if drain else "aborting")
        if not drain and engine.in_flight:
            self._count("aborted_on_remove")
            await abort_requests(
                self._client,
                {engine.url: ()},
                abort_all=True,
                timeout_s=abort_timeout_s,
                settle_timeout_s=abort_timeout_s,
            )
        while engine.in_flight:
            await self._balancer.changed()
        self._balancer.drop(engine)
        self._gave_up.pop(engine.url, None)
        self._count("removed")
