"""One rollout's run on a :class:`~miles_lite.rollout.driver.Driver`: which groups run,
which are kept, the workers and the hand-over of units, the early stop, and the result
(the mechanics are in :mod:`miles_lite.rollout.driver`'s docstring)."""

from __future__ import annotations

import math
import time
from collections import deque
from contextlib import ExitStack
from operator import attrgetter
from typing import Any, Protocol

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from miles_lite._core.idle import IdleWorkers
from miles_lite.errors import GenerateError, MilesLiteError
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.filters import GroupFilter, apply_filters
from miles_lite.rollout.hooks import RunHooks
from miles_lite.rollout.kind import KindMetrics, RolloutKind
from miles_lite.rollout.progress import progress_bar
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.scoring import Scorer
from miles_lite.rollout.spans import RunTimes, UnitSpan, span_metrics
from miles_lite.types import Sample, SampleStatus

#: A unit handed to a worker: (group index, unit index, its samples, its span). No span
#: (an empty group): the group ends at once.
_Job = tuple[int, int, list[Sample], UnitSpan | None]

__all__ = ["DriverParts", "RunState"]


class DriverParts(Protocol):
    """What a run reads of its :class:`~miles_lite.rollout.driver.Driver` (which
    imports this module, so the run names the parts, not the class)."""

    @property
    def kind(self) -> RolloutKind: ...
    @property
    def scorer(self) -> Scorer: ...
    @property
    def filters(self) -> list[GroupFilter]: ...
    @property
    def progress(self) -> bool: ...
    @property
    def stop_timeout_s(self) -> float: ...
    @property
    def max_started_samples(self) -> int | None: ...
    @property
    def runs(self) -> set[RunContext]: ...


#: Groups started per loop step (see RunState._schedule).
_START_CHUNK = 8
#: What the scheduler's inbox carries besides the index of a finished group.
_WAKE = -1
_STOP = -2
#: Statuses of a sample that needs no more generation.
_DONE = (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
_STATUS = attrgetter("status")


class RunState:
    """The state of one rollout: which groups run, which are kept, and the stop."""

    def __init__(
        self,
        driver: DriverParts,
        groups: list[list[Sample]],
        context: RunContext,
        *,
        target: int | None,
        batch_size: int | None,
        hooks: RunHooks | None = None,
    ) -> None:
        self.driver = driver
        self.kind = driver.kind
        self.context = context
        self.groups = groups
        self.target = len(groups) if target is None else target
        self.batch_size = batch_size or max(self.target, 1)
        if self.target < 0 or self.batch_size < 1:
            raise ValueError(f"target {target!r} and batch_size {batch_size!r} must be >= 1")
        self.max_started = driver.max_started_samples or math.inf
        self.started_sizes: dict[int, int] = {}  # samples of each started group not yet done
        self.started_samples = 0  # their sum
        self.kept: list[int] = []
        self.outputs: dict[int, list[list[Sample]]] = {}
        self.filtered: list[tuple[int, str]] = []
        self.finished: set[int] = set()
        self.spans: list[UnitSpan] = []
        self.stopping = context.stop
        self.abort_metrics: dict[str, float] = {}
        self.generating = 0
        self.drained = anyio.Event()
        self.done_send, self.done_receive = anyio.create_memory_object_stream[int](math.inf)
        self.bar: Any = None
        self.stop_time: float | None = None
        self.stop_start: float | None = None
        self.start_time = self.end_time = 0.0
        self.started = 0  # the next group never started yet
        self.active = 0  # groups started and not finished
        self.ends_queued = 0  # groups ended whose end the scheduler has not counted yet
        self.hooks = hooks
        self.restarts: deque[int] = deque()  # refused groups to start again
        self.over = False  # the result is made: refusals change nothing
        self.unfinished: dict[int, int] = {}  # units of each started group still running
        self.idle: IdleWorkers[_Job] = IdleWorkers()  # workers waiting for a unit
        self.closing = False  # no unit comes any more: idle workers end

    async def execute(self) -> RolloutResult:
        t0 = self.start_time = time.monotonic()
        driver = self.driver
        total = sum(len(g) for g in self.groups[: self.target])
        self.bar = progress_bar(total) if driver.progress else None
        with ExitStack() as stack:
            kind_metrics = stack.enter_context(self.kind.measure())
            windows = {
                k: stack.enter_context(p.measure()) for k, p in driver.scorer.rewards.items()
            }
            try:
                async with anyio.create_task_group() as tg:
                    try:
                        if self.hooks is not None:
                            self.hooks.attach(self)
                        await self._schedule(tg)
                        self._release_workers()
                    finally:
                        if not self.stopping.is_set() and self._running():
                            # Cancelled from outside: still stop the engines' work.
                            await self._stop(tg)
            finally:
                self.over = True
                self.done_send.close()
                self.done_receive.close()
                if self.bar is not None:
                    self.bar.close()
            self.end_time = time.monotonic()
            elapsed = self.end_time - t0
            metrics = self._metrics(elapsed, kind_metrics, windows)
        return self._result(self.context.rollout_id, metrics)

    async def _schedule(self, tg: TaskGroup) -> None:
        while True:
            while (
                self._startable()
                and self.active < self.target - len(self.kept)
                and self._fits()
                and self._admits()
            ):
                for i in range(min(self.batch_size, self._startable())):
                    if not (self._startable() and self._fits() and self._admits()):
                        break
                    if i and i % _START_CHUNK == 0:
                        # Let the groups just started take their first steps (and the
                        # loop its other work) before starting more: hundreds of first
                        # steps in one loop iteration stall it for a quarter second.
                        await anyio.lowlevel.checkpoint()
                    self._start(tg)
            if self.active == 0 and not (self.hooks is not None and self.hooks.holding()):
                return
            token = await self.done_receive.receive()
            if token == _WAKE:
                continue
            if token == _STOP:
                if self._running():
                    await self._stop(tg)
                return
            self.started_samples -= self.started_sizes.pop(token)
            self.active -= 1
            self.ends_queued -= 1
            if len(self.kept) >= self.target and self._running():
                # Enough are kept and groups still run (not only ends yet to be counted
                # here): stop them. Else the loop's head ends the run once every end is
                # counted and no kept group may still be refused (and started again).
                await self._stop(tg)
                return

    def _running(self) -> bool:
        """Whether a started group has not ended (ends not yet counted do not run)."""
        return self.active > self.ends_queued

    def _startable(self) -> int:
        """Groups that may start: refused ones to start again (once their first run's end
        was counted), then groups never started."""
        ready = sum(i not in self.started_sizes for i in self.restarts)
        return ready + len(self.groups) - self.started

    def _next(self) -> int:
        for index in self.restarts:
            if index not in self.started_sizes:
                self.restarts.remove(index)
                return index
        self.started += 1
        return self.started - 1

    def _start(self, tg: TaskGroup) -> None:
        index = self._next()
        group = self.groups[index]
        size = self.started_sizes[index] = len(group)
        self.started_samples += size
        self.active += 1
        if self.hooks is not None:
            self.hooks.started(index)
        units = self.kind.units(group)
        # Units write what they made here, so a group stopped early keeps the samples its
        # generate functions returned (they may be new objects) with their partial output.
        self.outputs[index] = [list(u) for u in units]
        self.unfinished[index] = len(units)
        if not units:
            self._hand_out(tg, (index, -1, [], None))
        for u, unit in enumerate(units):
            span = UnitSpan(group_index=index, unit_index=u, size=len(unit))
            self.spans.append(span)
            self._hand_out(tg, (index, u, unit, span))

    def _hand_out(self, tg: TaskGroup, job: _Job) -> None:
        """Give ``job`` to an idle worker, or to a new one when none is idle."""
        if not self.idle.hand(job):
            tg.start_soon(self._work, job)

    async def _work(self, job: _Job | None) -> None:
        """A worker: runs the units it is handed (and ends the groups they complete),
        waiting idle between them, until the run needs no more units.

        A unit's generate call is awaited here, not in a helper coroutine: every response
        wakes each coroutine level between the loop and the socket, and this runs once
        per text sample."""
        kind, context = self.kind, self.context
        while job is not None:
            index, u, unit, span = job
            if span is not None:
                out: list[Sample] | None = unit
                if not _all_done(unit):  # else carried over from an earlier rollout
                    out = None
                    if not self.stopping.is_set():  # else never sent
                        self.generating += 1
                        try:
                            out = await kind.generate(unit, span, context)
                        except MilesLiteError as exc:
                            out = _failed(unit, span, exc)
                        except Exception as exc:
                            out = _failed(unit, span, _generate_error(exc))
                        else:
                            _take_places(out, unit)
                        finally:
                            self.generating -= 1
                            if self.generating == 0 and self.stopping.is_set():
                                self.drained.set()
                        span.aborted = _any_aborted(out)
                if out is not None:
                    self.outputs[index][u] = out
                    if not self.stopping.is_set():  # no reward for work no longer needed
                        span.reward_start = time.monotonic()
                        await self.driver.scorer.score_unit(out, url=span.engine, span=span)
                        span.reward_end = time.monotonic()
                self.unfinished[index] -= 1
            if self.unfinished[index] == 0:  # its last unit (or an empty group)
                await self._end_group(index)
            if self.closing:
                return
            job = await self.idle.wait()

    def _release_workers(self) -> None:
        """The run is over: idle workers end (a unit still running ends its worker)."""
        self.closing = True
        self.idle.release()

    def _fits(self) -> bool:
        """Whether the next group may start under ``max_started_samples``."""
        ready = [i for i in self.restarts if i not in self.started_sizes]
        size = len(self.groups[ready[0] if ready else self.started])
        return not self.started_sizes or self.started_samples + size <= self.max_started

    def _admits(self) -> bool:
        return self.hooks is None or self.hooks.admits()

    # -- RunHandle: what the hooks may do -----------------------------------------------

    def _send(self, token: int) -> None:
        if not self.over:
            self.done_send.send_nowait(token)

    def wake(self) -> None:
        """See :meth:`~miles_lite.rollout.hooks.RunHandle.wake`."""
        self._send(_WAKE)

    def stop(self) -> None:
        """See :meth:`~miles_lite.rollout.hooks.RunHandle.stop`."""
        self._send(_STOP)

    def refuse(self, index: int, restart: list[Sample] | None, reason: str) -> bool:
        """See :meth:`~miles_lite.rollout.hooks.RunHandle.refuse`."""
        if self.over or index not in self.kept:
            return False
        self.kept.remove(index)
        if restart is None:
            self.filtered.append((index, reason))
        else:
            self.finished.discard(index)
            self.groups[index] = restart
            self.outputs.pop(index, None)
            self.restarts.append(index)
        self._send(_WAKE)
        return True

    async def _stop(self, tg: TaskGroup) -> None:
        """Early stop: nothing new is sent, in-flight work is aborted, the rest cancelled."""
        t0 = self.stop_start = time.monotonic()
        self.stopping.set()
        with anyio.move_on_after(self.driver.stop_timeout_s, shield=True):
            alone = self.driver.runs == {self.context}
            self.abort_metrics = await self.kind.abort(self.context, alone=alone)
            if self.kind.drain_on_stop and self.generating:
                await self.drained.wait()
        self.stop_time = time.monotonic() - t0
        tg.cancel_scope.cancel()

    async def _end_group(self, index: int) -> None:
        """Group ``index``'s units have all ended: score it whole, filter it, count it."""
        del self.unfinished[index]
        if self.stopping.is_set():
            return
        whole = self._whole(index)
        await self.driver.scorer.score_group(whole)
        verdict = apply_filters(self.driver.filters, whole)
        if self.stopping.is_set():
            return
        if verdict.keep and len(self.kept) < self.target:
            self.kept.append(index)
            if self.bar is not None:
                self.bar.update(len(whole))
        elif verdict.keep:
            return  # finished after enough were kept: it stays partial (already whole)
        else:
            self.filtered.append((index, verdict.reason or "filtered"))
        self.finished.add(index)
        self.ends_queued += 1
        self.done_send.send_nowait(index)
        if self.hooks is not None:
            # After the end is queued: a refusal it makes is seen by the scheduler after.
            self.hooks.finished(index, whole, verdict.keep)

    def _whole(self, index: int) -> list[Sample]:
        """Group ``index`` as its units left it (the input samples if it never started)."""
        outputs = self.outputs.get(index)
        if outputs is not None:
            whole = [s for out in outputs for s in out]
            for sample in whole:
                sample.group_index = index
            self.groups[index] = whole
        return self.groups[index]

    def _metrics(
        self, elapsed: float, kind_metrics: KindMetrics, windows: dict[str, Any]
    ) -> dict[str, float]:
        kept = [s for i in self.kept for s in self.groups[i]]
        metrics: dict[str, float] = {
            "perf/rollout_time": elapsed,
            "rollout/kept_groups": float(len(self.kept)),
            "rollout/started_groups": float(self.started),
            "rollout/samples": float(len(kept)),
            "rollout/failed_samples": float(sum(s.status is SampleStatus.FAILED for s in kept)),
            "rollout/filtered_groups": float(len(self.filtered)),
            "rollout/partial_groups": float(len(self.groups) - len(self.finished)),
        }
        for _, reason in self.filtered:
            key = f"rollout/dynamic_filter/{reason}"  # reasons read drop_...: filters.py
            metrics[key] = metrics.get(key, 0.0) + 1.0
        if self.stop_time is not None:
            metrics["perf/stop_time"] = self.stop_time
        for kind, window in windows.items():
            if window.ran:
                metrics[f"perf/reward_max_queue_depth_{kind}"] = float(window.max_queue_depth)
        metrics.update(span_metrics(self.spans))
        metrics.update(kind_metrics(kept, elapsed))
        metrics.update(self.abort_metrics)
        return metrics

    def _result(self, rollout_id: int, metrics: dict[str, float]) -> RolloutResult:
        def ordered(group: list[Sample]) -> list[Sample]:
            return sorted(group, key=lambda s: s.index)

        filtered = sorted(self.filtered)
        return RolloutResult(
            groups=[ordered(self.groups[i]) for i in sorted(self.kept)],
            filtered=[ordered(self.groups[i]) for i, _ in filtered],
            filter_reasons=[reason for _, reason in filtered],
            # What each unit's generate call returned (partial output included): the
            # driver owns identity, so nobody copies fields into the input samples.
            partial=[
                ordered(self._whole(i)) for i in range(len(self.groups)) if i not in self.finished
            ],
            metrics=metrics,
            spans=sorted(self.spans, key=lambda s: (s.group_index, s.unit_index)),
            rollout_id=rollout_id,
            times=RunTimes(
                start=self.start_time,
                end=self.end_time,
                stop_start=self.stop_start,
                stop_end=(
                    None
                    if self.stop_start is None or self.stop_time is None
                    else self.stop_start + self.stop_time
                ),
            ),
        )


def _all_done(unit: list[Sample]) -> bool:
    """Whether every sample of ``unit`` needs no more generation (no generator frame:
    this runs once per unit)."""
    return all(map(_DONE.__contains__, map(_STATUS, unit)))


def _any_aborted(samples: list[Sample]) -> bool:
    return SampleStatus.ABORTED in map(_STATUS, samples)


def _take_places(out: list[Sample], unit: list[Sample]) -> None:
    """The driver owns identity: whatever objects a generate call returns take the places
    (and the numbers) of the samples they fill (when as many came back as were given)."""
    if len(out) == len(unit):
        for made, place in zip(out, unit, strict=True):
            made.index, made.group_index = place.index, place.group_index


def _generate_error(exc: Exception) -> GenerateError:
    """A generate function's own exception (not a typed one) as a GenerateError."""
    error = GenerateError(f"generate function raised {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


def _failed(unit: list[Sample], span: UnitSpan, error: MilesLiteError) -> list[Sample]:
    """``unit`` failed with ``error``: every sample FAILED, the span names it."""
    for sample in unit:
        sample.fail(error)
    span.error = str(error)
    return unit
