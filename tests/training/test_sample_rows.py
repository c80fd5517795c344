"""Sample records go to the writer as rows (no closure each) and are inserted in runs of
consecutive rows (up to 64 a statement): the order they were queued in still decides which record of a place
and attempt is kept, and every record queued before a flush is in the file after it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio.to_thread
import pytest

from miles_lite import SampleStatus
from miles_lite.training import Journal, read_resume
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
