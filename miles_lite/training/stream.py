"""Streaming kept groups to a trainer as they finish, with backpressure and a staleness
bound: ``Rollout.stream``.

Usage::

    async with rollout.stream(prompts, max_ahead=16) as groups:
        async for group in groups:          # a kept group, as soon as it is whole
            ...
    groups.result.partial                   # unfinished groups: pass them to the next call

Why ``async with`` around the ``async for``: the groups generate in tasks that must live
in a task group, and a task group cannot stay open across the yields of an async
generator (its cancel scope would leak into the consumer's code); the block bounds their
lifetime, and leaving it (``break``, an error, cancellation) stops the run as an early
stop does: in-flight requests are aborted at the engines (shielded, bounded) and
unfinished groups come back in ``result.partial``.

Backpressure: at most ``max_ahead`` groups are started and not yet taken by the trainer
(generating, or finished and waiting in the buffer); when the trainer is slow, no more
groups start. A group dropped by a filter frees its place at once.

Staleness: with ``max_staleness`` (the rollout config), each group is checked when the
trainer takes it (the weights may have moved on while it waited): one lagging more is
never handed over; by ``staleness_policy`` it is dropped, or its stale samples are reset
and the group starts again (or, once the run is over, comes back in ``result.partial``).
"""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from miles_lite.rollout.result import RolloutResult
from miles_lite.training.staleness import StalenessGate
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.rollout.driver import Driver
    from miles_lite.rollout.hooks import RunHandle
    from miles_lite.training.recorder import RolloutJournal

__all__ = ["GroupStream", "StreamStatistics"]


class StreamStatistics:
    """Counters of one stream (read at any time; see :meth:`GroupStream.statistics`).

    ``started``: group starts (restarts included); ``delivered``: groups the trainer
    took; ``max_ahead_seen``: the most groups started and not yet taken at once;
    ``max_buffered``: the most finished groups waiting for the trainer at once;
    ``dropped_stale`` / ``resumed_stale``: groups refused for staleness (dropped / started
    again or returned as partial), ``resumed_samples``: samples reset for it.
    """

    __slots__ = (
        "delivered",
        "dropped_stale",
        "max_ahead_seen",
        "max_buffered",
        "resumed_samples",
        "resumed_stale",
        "started",
    )

    def __init__(self) -> None:
        self.started = 0
        self.delivered = 0
        self.max_ahead_seen = 0
        self.max_buffered = 0
        self.dropped_stale = 0
        self.resumed_stale = 0
        self.resumed_samples = 0


class GroupStream:
    """The kept groups of one run, as they finish (see the module docstring).

    Made by ``Rollout.stream``; an async context manager whose value is an async iterator
    of groups (each a ``list[Sample]``, sorted by index). :attr:`result` is the run's
    :class:`RolloutResult` once the block has exited: ``groups`` are the groups the
    trainer took, ``partial`` what to pass to the next call, ``metrics`` the run's (with
    ``rollout/staleness_*``, ``rollout/tokens_per_version/*`` and ``rollout/stream_*``).
    """

    def __init__(
        self,
        driver: Driver,
        groups: list[list[Sample]],
        *,
        max_ahead: int,
        target: int | None,
        batch_size: int | None,
        rollout_id: int,
        gate: StalenessGate,
        engines: tuple[str, ...] = (),
        journal: RolloutJournal | None = None,
    ) -> None:
        self._journal = journal  # a group is durable in it before it is yielded
        self._driver = driver
        self._engines = engines
        self._groups = groups
        self._max_ahead = max_ahead
        self._target = target
        self._batch_size = batch_size
        self._rollout_id = rollout_id
        self._gate = gate
        self._stats = StreamStatistics()
        self._buffer: deque[tuple[int, list[Sample]]] = deque()
        self._released = 0  # groups no longer ahead: taken, dropped by a filter, refused
        self._handle: RunHandle | None = None
        self._changed = anyio.Event()
        self._done = False
        self._taken: list[list[Sample]] = []
        self._late: list[list[Sample]] = []  # resumed after the run ended: partial
        self._late_drops: list[list[Sample]] = []  # dropped after the run ended: filtered
        self._driver_result: RolloutResult | None = None
        self._result: RolloutResult | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._entered = False
        self._stop_requested = False

    # -- RunHooks ------------------------------------------------------------------------

    def attach(self, handle: RunHandle) -> None:
        self._handle = handle
        if self._stop_requested:
            handle.stop()

    def admits(self) -> bool:
        return self._stats.started - self._released < self._max_ahead

    def started(self, index: int) -> None:
        stats = self._stats
        stats.started += 1
        stats.max_ahead_seen = max(stats.max_ahead_seen, stats.started - self._released)

    def finished(self, index: int, group: list[Sample], kept: bool) -> None:
        if kept:
            self._buffer.append((index, group))
            self._stats.max_buffered = max(self._stats.max_buffered, len(self._buffer))
            self._signal()
        else:
            self._release()

    def holding(self) -> bool:
        return bool(self._buffer)

    # -- the consumer's side -------------------------------------------------------------

    def statistics(self) -> StreamStatistics:
        """The live counters (see :class:`StreamStatistics`)."""
        return self._stats

    @property
    def result(self) -> RolloutResult:
        """The run's result; ``RuntimeError`` before the block has exited."""
        if self._result is None:
            raise RuntimeError("GroupStream.result is known once its async with block exited")
        return self._result

    def __aiter__(self) -> GroupStream:
        return self

    async def __anext__(self) -> list[Sample]:
        """The next kept group, fresh enough (waits for one); ``StopAsyncIteration`` once
        the run is over and every kept group was handed over or refused."""
        if not self._entered:
            raise RuntimeError("iterate a GroupStream inside its async with block")
        while True:
            if self._buffer:
                index, group = self._buffer.popleft()
                if self._fresh(index, group):
                    self._taken.append(sorted(group, key=lambda s: s.index))
                    self._stats.delivered += 1
                    self._release()
                    if self._journal is not None:
                        await self._journal.hand(self._rollout_id, [self._taken[-1]])
                    return self._taken[-1]
                continue
            if self._done:
                raise StopAsyncIteration
            await self._changed.wait()

    def _fresh(self, index: int, group: list[Sample]) -> bool:
        """Whether ``group`` may go to the trainer; if not, it is dropped or resumed."""
        verdict = self._gate.check(group)
        if verdict == "fresh":
            return True
        handle = self._handle
        if verdict == "dropped":
            self._stats.dropped_stale += 1
            if handle is None or not handle.refuse(index, None, "stale"):
                self._late_drops.append(group)
        else:
            self._stats.resumed_stale += 1
            self._stats.resumed_samples = self._gate.resumed_samples
            if handle is None or not handle.refuse(index, group, "stale"):
                self._late.append(group)
        self._release()
        return False

    def _release(self) -> None:
        self._released += 1
        if self._handle is not None:
            self._handle.wake()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- lifetime ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            self._driver_result = await self._driver.run(
                self._groups,
                target=self._target,
                batch_size=self._batch_size,
                rollout_id=self._rollout_id,
                hooks=self,
            )
        finally:
            self._done = True
            self._signal()

    async def __aenter__(self) -> GroupStream:
        if self._entered:
            raise RuntimeError("a GroupStream can be entered once; call rollout.stream() again")
        self._entered = True
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run, name="stream rollout")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        if not self._done:
            # The trainer left: stop as an early stop does (in-flight work aborted,
            # bounded), also when the run has not attached yet.
            self._stop_requested = True
            if self._handle is not None:
                self._handle.stop()
        try:
            if exc is None or isinstance(exc, Exception):
                # Its own error goes on as it is, not wrapped in an exception group,
                # once the run has stopped.
                await tg.__aexit__(None, None, None)
                return None
            return await tg.__aexit__(exc_type, exc, tb)  # cancellation
        finally:
            if self._driver_result is not None:
                self._result = self._finish(self._driver_result)
                if self._journal is not None:
                    self._journal.end(self._rollout_id, self._result)

    def _finish(self, run: RolloutResult) -> RolloutResult:
        """The stream's result from the run's: groups the trainer took; kept groups it did
        not take (it left early) and late refusals come back as partial."""
        handled = {id(s) for g in (*self._taken, *self._late, *self._late_drops) for s in g}
        untaken = [g for g in run.groups if not any(id(s) in handled for s in g)]
        metrics = dict(run.metrics)
        metrics["rollout/prompts"] = float(len(self._groups))
        metrics.update(self._gate.metrics(self._taken))
        stats = self._stats
        metrics["rollout/stream_delivered_groups"] = float(stats.delivered)
        metrics["rollout/stream_max_ahead"] = float(stats.max_ahead_seen)
        metrics["rollout/stream_max_buffered"] = float(stats.max_buffered)
        return RolloutResult(
            groups=list(self._taken),
            filtered=[*run.filtered, *self._late_drops],
            filter_reasons=[*run.filter_reasons, *["stale"] * len(self._late_drops)],
            partial=[*run.partial, *untaken, *self._late],
            metrics=metrics,
            spans=run.spans,
            rollout_id=run.rollout_id,
            engines=self._engines,
            times=run.times,
        )
