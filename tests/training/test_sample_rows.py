"""Sample records go to the writer as rows (no closure each) and are inserted in runs of
consecutive rows (up to 64 a statement): the order they were queued in still decides which record of a place
and attempt is kept, and every record queued before a flush is in the file after it."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import anyio.to_thread
import pytest

from miles_lite import SampleStatus
from miles_lite.training import Journal, read_resume
from miles_lite.training.codec import handed_entries, is_reference
from miles_lite.training.recorder import RolloutJournal
from miles_lite.types import Sample

pytestmark = pytest.mark.anyio


def made(tokens: list[int], status: SampleStatus) -> Sample:
    return Sample(
        index=0,
        prompt="p",
        status=status,
        tokens=tokens,
        response_length=len(tokens) - 1,
        rollout_log_probs=[-0.5] * (len(tokens) - 1),
    )


async def test_a_call_record_queued_after_its_progress_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        groups = [
            [Sample(index=j, prompt=f"p{g}", seed=g + j) for j in range(2)] for g in range(40)
        ]
        gids = journal.give(groups, rollout_id=0)
        for gid in gids:  # queued back to back, without an await: one batch or several
            attempt = journal.next_attempt()
            assert journal.progress(gid, 0, attempt, made([1, 2], SampleStatus.ABORTED))
            assert journal.record_nowait(gid, 0, attempt, [made([1, 2, 3], SampleStatus.COMPLETED)])
            assert journal.record_nowait(
                gid, 1, journal.next_attempt(), [made([4, 5], SampleStatus.TRUNCATED)]
            )
        await journal.flush()
        stats = journal.statistics()
    assert stats.samples == 80  # progress records are not counted as samples written
    rows = await anyio.to_thread.run_sync(_sample_rows, path)
    assert rows == [(g, s, st) for g in gids for s, st in ((0, "completed"), (1, "truncated"))]
    state = await anyio.to_thread.run_sync(read_resume, path)
    assert [[s.tokens for s in g] for g in state.pending] == [[[1, 2, 3], [4, 5]]] * 40


def _sample_rows(path: Path) -> list[tuple[int, int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT gid, slot, status FROM samples ORDER BY gid, slot").fetchall()


async def test_a_handed_sample_references_its_record_only_if_it_is_the_object_recorded(
    tmp_path: Path,
) -> None:
    """What the rollout's recorder hands: a reference (place, attempt) for a sample that is
    the very object its generate call's record was made from, the whole record for any
    other (a copy, a sample from an earlier call); a group's references are forgotten once
    handed."""
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        recorder = RolloutJournal(journal, n_samples=3)
        group = [Sample(index=j, prompt="p", seed=j) for j in range(3)]
        recorder.begin([group], rollout_id=0)
        gid = recorder.gid(0, 0)
        assert gid is not None
        done = [made([1, 2, 3], SampleStatus.COMPLETED) for _ in range(3)]
        attempts = [journal.next_attempt() for _ in range(3)]
        for slot in (0, 2):  # place 1 never recorded
            assert journal.record_nowait(gid, slot, attempts[slot], [done[slot]])
            recorder.recorded(gid, slot, attempts[slot], done[slot])
        copy = dataclasses.replace(done[2])  # equal, but not the object recorded
        await recorder.hand(0, [[done[0], done[1], copy]])
        await recorder.hand(0, [[done[0], done[1], done[2]]])  # forgotten: whole records
    with sqlite3.connect(path) as conn:
        blobs = [b for (b,) in conn.execute("SELECT blob FROM handed ORDER BY rowid")]
    first, second = (handed_entries(blob) for blob in blobs)
    assert is_reference(first[0]) and first[0][:2] == [0, attempts[0]]
    assert not is_reference(first[1]) and not is_reference(first[2])
    assert not any(is_reference(entry) for entry in second)
