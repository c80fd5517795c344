"""A rollout's side of its journal: what the rollout calls at each event of a run
(:class:`RolloutJournal`), and the kind wrapper that records each sample as its generate
call ends (:class:`JournaledKind`).

Events and records: the groups of a ``run()``/``stream()`` call are given (:meth:`begin`);
each generate call takes an attempt number before it sends anything and its samples are
recorded when it ends (queued, never waiting on the disk); a kept group is handed
durably (:meth:`hand`: ``stream()`` before it yields, ``run()`` before it returns); the
verdicts of filtered and partial groups are recorded when the call ends.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from miles_lite.rollout.context import RunContext
from miles_lite.rollout.kind import KindMetrics, RolloutKind
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.spans import UnitSpan
from miles_lite.training._schema import GROUP_KEY
from miles_lite.training.journal import Journal, JournalConfig
from miles_lite.training.reader import ResumeState
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.training.batch import TrainingBatch

__all__ = ["JournaledKind", "ProgressScope", "RolloutJournal", "open_journal"]

#: How a kind's generate call for one sample streams its progress: ``(kind, sample,
#: record, config)`` -> a scope to run the call in, handing ``record`` the sample so far
#: as ``config`` says (every ``stream_tokens_every`` tokens or ``stream_tokens_ms``
#: milliseconds), or None when the kind does not stream. The text rollout gives
#: :func:`miles_lite.text.progress.stream_progress`.
ProgressScope = Callable[
    [RolloutKind, Sample, Callable[[Sample], None], JournalConfig],
    AbstractContextManager[None] | None,
]


class RolloutJournal:
    """The events of one rollout's runs, into ``journal``; ``n_samples`` per group."""

    def __init__(
        self, journal: Journal, n_samples: int, progress: ProgressScope | None = None
    ) -> None:
        self.journal = journal
        self.n_samples = n_samples
        self.progress = progress
        self._gids: dict[int, list[int]] = {}  # per rollout id: the journal id of each group
        # Per group id, until handed or its call ends: the sample whose generate call was
        # recorded at each place, and that call's attempt. Two lists a group, not an object
        # a sample: what lives as long as a request is what the collector keeps walking.
        self._recorded: dict[int, tuple[list[Sample | None], list[int]]] = {}

    def begin(self, groups: Sequence[list[Sample]], rollout_id: int) -> None:
        """The groups of the call with ``rollout_id`` are given."""
        self._gids[rollout_id] = self.journal.give(groups, rollout_id)

    def gid(self, rollout_id: int, group_index: int) -> int | None:
        gids = self._gids.get(rollout_id)
        return None if gids is None or group_index >= len(gids) else gids[group_index]

    async def hand(self, rollout_id: int, groups: Sequence[list[Sample]]) -> None:
        """``groups`` (of the call ``rollout_id``) go to the trainer: durable first."""
        items = []
        for group in groups:
            gid = self._group_gid(rollout_id, group)
            if gid is not None:
                items.append((gid, group, self._refs(gid, group)))
        if items:
            await self.journal.hand(items)

    def _refs(self, gid: int, group: list[Sample]) -> list[tuple[int, int] | None]:
        """The (place, attempt) each sample of ``group`` was recorded under (None: not
        recorded as this very object); the group's records are forgotten."""
        recorded = self._recorded.pop(gid, None)
        if recorded is None:
            return [None] * len(group)
        samples, attempts = recorded
        slots = {id(s): k for k, s in enumerate(samples) if s is not None}  # held: ids unique
        refs: list[tuple[int, int] | None] = []
        for sample in group:
            slot = slots.get(id(sample))
            refs.append(None if slot is None else (slot, attempts[slot]))
        return refs

    def recorded(self, gid: int, slot: int, attempt: int, sample: Sample) -> None:
        """``sample`` was recorded as (``gid``, ``slot``, ``attempt``)."""
        recorded = self._recorded.get(gid)
        if recorded is None:
            size = max(self.n_samples, slot + 1)
            recorded = self._recorded[gid] = ([None] * size, [0] * size)
        samples, attempts = recorded
        if slot >= len(samples):
            grow = slot + 1 - len(samples)
            samples.extend([None] * grow)
            attempts.extend([0] * grow)
        samples[slot], attempts[slot] = sample, attempt

    def end(self, rollout_id: int, result: RolloutResult) -> None:
        """The call ended with ``result`` (its kept groups handed): record its verdicts,
        and put the writer's counters in ``result.metrics`` (``journal/samples_written``,
        ``journal/queue_max``, ``journal/blocked_puts``: the back-pressure,
        ``journal/blocked_s``, ``journal/writer_cpu_s``; over the journal's life)."""
        verdicts: list[tuple[int, str, str | None]] = []
        for group, reason in zip(result.filtered, result.filter_reasons, strict=False):
            gid = self._group_gid(rollout_id, group)
            if gid is not None:
                verdicts.append((gid, "filtered", reason))
        for group in result.partial:
            gid = self._group_gid(rollout_id, group)
            if gid is not None:
                verdicts.append((gid, "partial", None))
        self.journal.verdicts(verdicts)
        # The writer's counters so far (the journal's whole life, not this call's).
        stats = self.journal.statistics()
        result.metrics["journal/samples_written"] = float(stats.samples)
        result.metrics["journal/queue_max"] = float(stats.queue_max)
        result.metrics["journal/blocked_puts"] = float(stats.blocked_puts)
        result.metrics["journal/blocked_s"] = stats.blocked_s
        result.metrics["journal/writer_cpu_s"] = stats.cpu_s
        for gid in self._gids.pop(rollout_id, ()):
            self._recorded.pop(gid, None)

    def _group_gid(self, rollout_id: int, group: list[Sample]) -> int | None:
        if not group:
            return None
        known = group[0].metadata.get(GROUP_KEY)
        if isinstance(known, int):
            return known
        return self.gid(rollout_id, group[0].group_index)

    async def resume(self) -> ResumeState:
        return await self.journal.resume()

    async def commit(self, step: int, batch: TrainingBatch | None) -> None:
        await self.journal.commit(step, batch)

    def wrap(self, kind: RolloutKind) -> RolloutKind:
        return JournaledKind(kind, self)


class JournaledKind:
    """``kind`` with each generate call's samples recorded in ``journal`` as it ends (see
    the module docstring); everything else is ``kind``'s."""

    def __init__(self, kind: RolloutKind, journal: RolloutJournal) -> None:
        self.kind = kind
        self.journal = journal
        self.drain_on_stop = kind.drain_on_stop

    def units(self, group: list[Sample]) -> list[list[Sample]]:
        return self.kind.units(group)

    async def generate(self, unit: list[Sample], span: UnitSpan, run: RunContext) -> list[Sample]:
        # Runs once a sample: no closure (its cells), no list of places for a unit of one.
        recorder = self.journal
        journal = recorder.journal
        attempt = journal.next_attempt()
        if not unit:
            return await self.kind.generate(unit, span, run)
        # Places (and the group) from the samples given: what comes back may be new objects.
        n = recorder.n_samples
        first = unit[0]
        known = first.metadata.get(GROUP_KEY)
        gid = known if isinstance(known, int) else recorder.gid(run.rollout_id, first.group_index)
        slot = first.index - first.group_index * n
        slots = [s.index - s.group_index * n for s in unit] if len(unit) > 1 else None
        scope = None
        if gid is not None and slots is None and journal.config.streams:
            scope = self._progress_scope(gid, slot, attempt, first)
        if scope is None:
            out = await self.kind.generate(unit, span, run)
        else:
            with scope:
                out = await self.kind.generate(unit, span, run)
        if gid is None:
            return out
        if len(out) == len(unit):
            for k, sample in enumerate(out):
                place = slot if slots is None else slots[k]
                # Queued without an await (a coroutine) per sample: one only when full.
                if not journal.record_nowait(gid, place, attempt, [sample]):
                    await journal.record(gid, place, attempt, [sample])
                recorder.recorded(gid, place, attempt, sample)
        elif out and not journal.record_nowait(gid, slot, attempt, list(out)):
            await journal.record(gid, slot, attempt, list(out))
        return out

    def _progress_scope(
        self, gid: int, slot: int, attempt: int, sample: Sample
    ) -> AbstractContextManager[None] | None:
        """The scope streaming ``sample``'s generate call into the journal as it goes
        (None: the kind does not stream)."""
        recorder = self.journal
        if recorder.progress is None:
            return None
        journal = recorder.journal

        def progress(snapshot: Sample) -> None:
            journal.progress(gid, slot, attempt, snapshot)

        return recorder.progress(self.kind, sample, progress, journal.config)

    async def abort(self, run: RunContext, *, alone: bool) -> dict[str, float]:
        return await self.kind.abort(run, alone=alone)

    def measure(self) -> AbstractContextManager[KindMetrics]:
        return self.kind.measure()


@asynccontextmanager
async def open_journal(
    journal: str | os.PathLike[str] | Journal,
    *,
    kind: str,
    config: Any,
    progress: ProgressScope | None = None,
) -> AsyncIterator[RolloutJournal]:
    """The recorder of the journal a rollout's ``open`` was given: a path is opened (and
    closed on exit), a :class:`Journal` is used as it is (its owner closes it); either is
    bound to this run (``kind``, ``config``), so a file of another run is refused."""
    async with AsyncExitStack() as stack:
        if not isinstance(journal, Journal):
            journal = await stack.enter_async_context(Journal(journal))
        await journal.bind(kind, config)
        yield RolloutJournal(journal, config.n_samples_per_prompt, progress)
