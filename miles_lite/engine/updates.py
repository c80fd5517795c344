"""Updating the engines' weights between training steps (or while a rollout runs): the
router's :meth:`Router.update_weights <miles_lite.engine.router.Router.update_weights>`
(``Rollout.update_weights`` delegates to it), in this order:

1. the router holds new leases: requests wait in the router, not at paused engines, and
   leave afterwards with the new version's cache key;
2. with ``verify_flush``, a canary prompt is cached at every engine
   (:func:`~miles_lite.engine.cache_control.plant_cache_canary`), to check the flush's
   effect;
3. every engine pauses in the configured mode (``retract`` by default);
4. the weights are pushed (``/update_weights_from_disk`` with the version), or only the
   version is bumped (``/update_weight_version``, never aborting) when the trainer pushed
   the weights itself;
5. the prefix cache is flushed where the mode allows it (``retract``, ``abort``): the
   flush waits, with backoff and a bound, while an engine cannot flush yet;
6. every engine is asked its version. When none reports the new one, nothing moves: the
   version stays, the source stays, and the error names each engine and its answer (a
   typo in a checkpoint path does not strand the rollout). When some do, the router
   records the version (and whether requests in flight across the update kept KV from the
   old weights) and its source (:class:`~miles_lite.engine.fleet.WeightSource`); an
   engine that does not report it is fenced and caught up from that source by the fleet
   (:mod:`miles_lite.engine.fleet`), and the report names it (``behind``);
7. every engine continues (shielded and bounded: no engine stays paused, even when the
   update fails or is cancelled: a cancelled update reads the versions once more and
   records the new one only if some engine took it, so every engine is on the old or the
   new weights, fenced when not on the recorded ones), the hold ends, and the canary (if
   any) is sent again: an engine whose cache still holds it did not really flush.

Which engines: those in the fleet that are healthy and not draining (through SGLang's
router, the engines it lists); an engine out for its health is fenced at the new version
and checked when it returns.

The canary is off by default: SGLang 0.5.23 answers a flush it could not do with 400 (the
flush waits and retries then), and the canary's two short requests queue behind the
requests running at the engine (seconds, with a full batch of long generations), which
the trainer would wait for at every update. Turn it on to check a new engine version.

``retract`` with a flush is the default: the one mode measured exact (every token of a
request in flight across the update matches the weights of its span). ``in_place`` keeps
the requests' KV (SGLang cannot flush then), and so does ``retract`` without a flush:
those tokens are marked (:attr:`WeightSpan.kv_version
<miles_lite.types.WeightSpan.kv_version>`). In every mode, requests that start after the
update carry the new version's cache key, so they never reuse KV computed before it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio

from miles_lite._core.validate import check_choice, check_seconds
from miles_lite.engine.cache_control import flush_cache, plant_cache_canary, probe_cache_canary
from miles_lite.engine.control import (
    ControlReport,
    continue_generation,
    pause_generation,
    read_weight_versions,
    update_weight_version,
    update_weights_from_disk,
)
from miles_lite.engine.fleet import WeightSource
from miles_lite.errors import ConfigError, EngineControlError, EngineError
from miles_lite.sglang.control import PauseMode

if TYPE_CHECKING:
    from miles_lite.engine.http.client import EngineClient
    from miles_lite.engine.versions import WeightVersions

__all__ = ["UpdateTarget", "WeightUpdateConfig", "WeightUpdateReport", "update_engines"]


class UpdateTarget(Protocol):
    """What an update needs of the router that runs it (:class:`~miles_lite.engine.router.Router`
    is one): its versions and client, the engines to update, a hold on new leases, and
    the record of who took it."""

    versions: WeightVersions

    @property
    def client(self) -> EngineClient: ...

    def update_targets(self) -> tuple[str, ...]: ...

    def holding(self) -> AbstractContextManager[None]: ...

    def settle_update(
        self, source: WeightSource, took: Collection[str], *, mode: str, kept_kv: bool
    ) -> tuple[str, ...]: ...


@dataclass(frozen=True, kw_only=True)
class WeightUpdateConfig:
    """How a rollout updates its engines' weights (times in seconds).

    - ``mode``: how the engines pause (:class:`~miles_lite.sglang.control.PauseMode`):
      ``retract`` (default: requests in flight survive and, after the flush, are
      recomputed under the new weights), ``in_place`` (they survive with the KV of the
      old weights), ``abort`` (they are aborted and come back with partial output);
    - ``flush_cache``: flush the engines' prefix cache after the push; ``None`` (the
      default) flushes where the mode allows it (not ``in_place``, where SGLang refuses
      while requests are held); ``True`` with ``in_place`` is refused;
    - ``verify_flush``: check the flush's effect with a cached canary prompt (off by
      default: its requests queue behind the running ones; see the module docstring);
    - ``control_timeout_s``: bound on each pause, continue, version bump and version read;
      ``load_timeout_s``: on loading the weights; ``flush_timeout_s``: on the flush's wait.

    Raises :class:`~miles_lite.errors.ConfigError` naming the field.

    Usage: ``WeightUpdateConfig(mode=PauseMode.IN_PLACE)``.
    """

    mode: PauseMode = PauseMode.RETRACT
    flush_cache: bool | None = None
    verify_flush: bool = False
    control_timeout_s: float = 10.0
    load_timeout_s: float = 300.0
    flush_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        owner = "WeightUpdateConfig"
        check_choice(owner, "mode", self.mode, tuple(PauseMode))
        if self.flush_cache is not None and not isinstance(self.flush_cache, bool):
            raise ConfigError(
                f"{owner}.flush_cache must be a bool or None, got {self.flush_cache!r}"
            )
        if self.flush_cache and PauseMode(self.mode) is PauseMode.IN_PLACE:
            raise ConfigError(
                f"{owner}.flush_cache=True cannot go with mode in_place: SGLang refuses to"
                " flush while requests are held in place (leave flush_cache None)"
            )
        if not isinstance(self.verify_flush, bool):
            raise ConfigError(f"{owner}.verify_flush must be a bool, got {self.verify_flush!r}")
        for name in ("control_timeout_s", "load_timeout_s", "flush_timeout_s"):
            check_seconds(owner, name, getattr(self, name))

    @property
    def flushes(self) -> bool:
        """Whether an update flushes the prefix cache."""
        if self.flush_cache is not None:
            return self.flush_cache
        return PauseMode(self.mode) is not PauseMode.IN_PLACE


@dataclass(frozen=True, slots=True)
class WeightUpdateReport:
    """How one weight update went.

    ``version`` pushed; ``mode`` of the pause; ``flushed``: the cache was flushed at
    every engine that took the weights; ``kept_kv``: requests in flight across it went
    on with KV of the old weights (their tokens are marked); one
    :class:`~miles_lite.engine.control.ControlReport` per stage (``plant``, ``flush``
    and ``verify`` are None when no flush was planned or checked); ``took``: the engines
    that report the version after it; ``moved``: whether the version was recorded (some
    engine took it; when none did, the rollout stays on its version); ``behind``: engines
    fenced until they report the version (the fleet catches them up); ``paused_s``: from
    the first pause to the last continue; ``elapsed_s``: the whole call.
    """

    version: str
    mode: PauseMode
    flushed: bool
    kept_kv: bool
    pause: ControlReport
    push: ControlReport
    flush: ControlReport | None
    versions: ControlReport
    resume: ControlReport
    plant: ControlReport | None
    verify: ControlReport | None
    behind: tuple[str, ...]
    took: tuple[str, ...]
    moved: bool
    paused_s: float
    elapsed_s: float

    @property
    def stages(self) -> tuple[ControlReport, ...]:
        """Every stage that ran, in order."""
        order = (self.plant, self.pause, self.push, self.flush, self.versions, self.resume)
        return tuple(r for r in (*order, self.verify) if r is not None)

    @property
    def ok(self) -> bool:
        """Whether every engine took every stage."""
        return self.moved and not self.behind and all(r.ok for r in self.stages)

    def raise_for_failures(self) -> None:
        """Raise :class:`~miles_lite.errors.EngineControlError` naming every engine that
        failed a stage (and every engine left behind); nothing if all went well."""
        failures: dict[str, EngineError] = {}
        lines = []
        for report in self.stages:
            for outcome in report.engines:
                if outcome.error is not None:
                    failures.setdefault(outcome.url, outcome.error)
                    lines.append(f"{report.action} at {outcome.url}: {outcome.error}")
        for outcome in self.versions.engines:
            if outcome.url not in self.took and outcome.url not in failures:
                failures[outcome.url] = EngineControlError(
                    f"reports weight version {outcome.version!r}, not {self.version!r}",
                    url=outcome.url,
                )
                lines.append(f"{outcome.url} reports weight version {outcome.version!r}")
        for url in self.behind:
            if url not in failures:
                failures[url] = EngineControlError(
                    f"does not report weight version {self.version!r}", url=url
                )
                lines.append(f"{url} does not report weight version {self.version!r}")
        if not lines and self.moved:
            return
        if not self.moved:
            outcome_text = "no engine took it; the rollout stays on its weight version"
        elif self.behind:
            outcome_text = (
                f"taken by {list(self.took)}; out of rotation and caught up from the same"
                f" source: {list(self.behind)}"
            )
        else:
            outcome_text = f"taken by {list(self.took)}"
        raise EngineControlError(
            f"weight update to {self.version!r}: {outcome_text}: " + "; ".join(lines),
            failures=failures,
        )


async def update_engines(
    router: UpdateTarget,
    model_path: str | os.PathLike[str] | None,
    *,
    version: str | int,
    config: WeightUpdateConfig | None = None,
    check: bool = True,
) -> WeightUpdateReport:
    """Update the engines of ``router`` to ``version`` (see the module docstring); what
    :meth:`Router.update_weights <miles_lite.engine.router.Router.update_weights>` runs.

    ``model_path``: the folder the engines load (``save_pretrained``'s, readable by them);
    ``None`` when the trainer pushed the weights itself: only the version is bumped (and
    no engine can be caught up from a folder). ``version`` must be new or the current one
    (a retry); an int is taken as its text. ``check``: raise
    :class:`~miles_lite.errors.EngineControlError` naming every engine that failed a
    stage and its answer, after everything else was done. Raises
    :class:`~miles_lite.errors.ConfigError` for a bad version. Cancellation propagates,
    after the engines were told to continue.
    """
    config = config if config is not None else WeightUpdateConfig()
    if isinstance(version, bool) or not isinstance(version, str | int):
        raise ConfigError(f"version must be a str or an int, got {version!r}")
    version = str(version)
    versions = router.versions
    versions.check_new(version)
    client, urls = router.client, router.update_targets()
    mode = PauseMode(config.mode)
    timeout_s = config.control_timeout_s
    path = None if model_path is None else os.fspath(model_path)
    source = WeightSource(
        path=path,
        version=version,
        load_timeout_s=config.load_timeout_s,
        control_timeout_s=timeout_s,
        flush_timeout_s=config.flush_timeout_s,
        flushes=config.flushes,
    )
    started = time.monotonic()
    canary = f"miles-lite-canary:{uuid.uuid4().hex}"
    plant = verify = flush = None
    read: ControlReport | None = None
    took: tuple[str, ...] = ()
    behind: tuple[str, ...] = ()
    settled = False
    with router.holding():
        if versions.current is None:
            # The first update: learn the engines' own version (SGLang's "default"), the
            # one requests sent before it were made by.
            before = await read_weight_versions(client, urls, timeout_s=timeout_s)
            versions.learn_base([e.version for e in before.engines if e.version is not None])
            versions.check_new(version)  # not the engines' own version either
        if config.flushes and config.verify_flush:
            plant = await plant_cache_canary(client, urls, canary, timeout_s=timeout_s)
        paused_at = time.monotonic()
        try:
            pause = await pause_generation(client, urls, mode, timeout_s=timeout_s)
            if path is not None:
                push = await update_weights_from_disk(
                    client, urls, path, version=version, timeout_s=config.load_timeout_s
                )
            else:
                push = await update_weight_version(client, urls, version, timeout_s=timeout_s)
            loaded = [e.url for e in push.engines if e.ok]
            if config.flushes and loaded:
                flush = await flush_cache(client, loaded, timeout_s=config.flush_timeout_s)
            read = await read_weight_versions(client, urls, timeout_s=timeout_s)
            took = tuple(e.url for e in read.engines if e.version == version)
            flushed = flush is not None and flush.ok and len(took) == len(urls)
            kept_kv = mode is not PauseMode.ABORT and not flushed
            if took:
                # Recorded before anything continues: answers that arrive from now on are
                # read against it, and requests leave with its cache key.
                behind = router.settle_update(source, took, mode=mode.value, kept_kv=kept_kv)
            settled = True
        finally:
            with anyio.CancelScope(shield=True):
                if not settled:
                    # Cancelled (or failed) mid-way: some engines may hold the new weights.
                    behind = await _settle_interrupted(router, source, urls, mode)
                resume = await continue_generation(client, urls, timeout_s=timeout_s)
        paused_s = time.monotonic() - paused_at
    assert read is not None  # set on every way that reaches here
    if plant is not None:
        planted = [e.url for e in plant.engines if e.ok and e.url in took]
        verify = await probe_cache_canary(client, planted, canary, timeout_s=timeout_s)
    report = WeightUpdateReport(
        version=version,
        mode=mode,
        flushed=flushed,
        kept_kv=kept_kv,
        pause=pause,
        push=push,
        flush=flush,
        versions=read,
        resume=resume,
        plant=plant,
        verify=verify,
        behind=behind,
        took=took,
        moved=bool(took),
        paused_s=paused_s,
        elapsed_s=time.monotonic() - started,
    )
    if check:
        report.raise_for_failures()
    return report


async def _settle_interrupted(
    router: UpdateTarget, source: WeightSource, urls: Sequence[str], mode: PauseMode
) -> tuple[str, ...]:
    """After an update stopped before it settled: read the versions once (bounded); if
    some engine took the new one, record it (its KV marked as kept: the flush may not
    have run) and fence the others. The engines fenced."""
    with anyio.move_on_after(source.control_timeout_s):
        read = await read_weight_versions(router.client, urls, timeout_s=source.control_timeout_s)
        took = tuple(e.url for e in read.engines if e.version == source.version)
        if took:
            kept_kv = mode is not PauseMode.ABORT
            return router.settle_update(source, took, mode=mode.value, kept_kv=kept_kv)
    return ()
