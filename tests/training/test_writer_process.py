"""The journal's writer process: it ends with the journal, a killed one fails every later
write with a typed error (and the journal still closes), one that cannot open the file
fails the open, its CPU is its own, and records past the pipe's room arrive whole."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

import anyio
import msgpack
import pytest

import miles_lite.training._writer as writer_module
from miles_lite.errors import JournalError
from miles_lite.training import Journal, JournalConfig
from miles_lite.training._writer import CLOSE, ROW, Writer, row_header
from miles_lite.training.codec import decode_samples
from miles_lite.types import Sample, SampleStatus
from tests.support.polling import wait_until
from tests.support.processes import alive

pytestmark = pytest.mark.anyio


def sample(index: int) -> Sample:
    s = Sample(index=index, prompt="p", status=SampleStatus.COMPLETED)
    s.tokens, s.response_length, s.rollout_log_probs = list(range(600)), 512, [-0.5] * 512
    return s


async def test_the_writer_process_applies_what_was_sent_and_ends_with_the_journal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        pid = journal.writer.pid
        assert pid is not None and pid != os.getpid() and alive(pid)
        (gid,) = journal.give([[sample(0), sample(1)]], rollout_id=0)
        for place in range(2):
            assert journal.record_nowait(gid, place, journal.next_attempt(), [sample(place)])
        await journal.flush()
        stats = journal.statistics()
        assert stats.samples == 2 and stats.transactions >= 1 and stats.durable >= 1
        assert stats.cpu_s > 0  # the writer process's own CPU, reported in its acks
    assert not alive(pid)  # closed: applied, ended and reaped
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 2


async def test_a_killed_writer_fails_later_writes_with_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        (gid,) = journal.give([[sample(0)]], rollout_id=0)
        await journal.flush()
        pid = journal.writer.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(JournalError, match="writer process ended unexpectedly"):
            await journal.flush()
        # A generate call's record is no place to fail the run: it is dropped, and the
        # hand-off (which the trainer waits for) raises.
        assert journal.record_nowait(gid, 0, journal.next_attempt(), [sample(0)])
        with pytest.raises(JournalError, match="writer process ended unexpectedly"):
            await journal.hand([(gid, [sample(0)], [None])])
    assert not alive(pid)
    with sqlite3.connect(path) as conn:  # what was acknowledged is there
        assert conn.execute("SELECT count(*) FROM groups").fetchone()[0] == 1


async def test_a_writer_that_cannot_open_the_file_fails_the_start(tmp_path: Path) -> None:
    writer = Writer(str(tmp_path / "no-such-folder" / "run.db"), max_bytes=None, queue_size=8)
    with pytest.raises(JournalError, match="unable to open"):
        await writer.start()
    assert writer.pid is None  # ended and reaped


async def test_records_past_the_pipes_room_arrive_whole_and_in_order(tmp_path: Path) -> None:
    # 600 records of ~7 KB (4 MB) sent with no await between them: more than the pipe
    # holds, so the loop's writes to it are partial and the rest waits for it to drain.
    path = tmp_path / "run.db"
    async with Journal(path, JournalConfig(queue_size=10_000)) as journal:
        (gid,) = journal.give([[sample(0)]], rollout_id=0)
        attempts = []
        for place in range(600):
            s = sample(place)
            s.tokens = [place] * 600
            attempts.append(journal.next_attempt())
            assert journal.record_nowait(gid, place, attempts[-1], [s])
        await journal.flush()
        assert journal.statistics().samples == 600
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT * FROM samples ORDER BY rowid").fetchall()
    assert len(rows) == 600
    for place, row in enumerate(rows):
        assert row[:4] == (gid, place, attempts[place], "completed")
        (decoded,) = decode_samples(row[4])
        assert decoded.tokens == [place] * 600


async def test_records_wait_for_the_pipe_and_a_durable_write_takes_them_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Records sent over many loop steps share one pipe write: they wait up to
    # _RECORD_FLUSH_S (here a minute), and a durable write sends them with it at once.
    monkeypatch.setattr(writer_module, "_RECORD_FLUSH_S", 60.0)
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        (gid,) = journal.give([[sample(0)]], rollout_id=0)
        await journal.flush()
    writer = Writer(str(path), max_bytes=None, queue_size=1000)
    await writer.start()
    try:
        for place in range(100):
            assert writer.row(gid, place, 1, "completed", b"x", samples=1)
            await asyncio.sleep(0)  # a loop step
        assert writer.pipe_writes == 0
        with anyio.fail_after(20):
            await writer.write_durably([])
        assert writer.pipe_writes == 1
        assert writer.statistics().samples == 100
    finally:
        await writer.close()


@pytest.mark.parametrize("size", [0, 1, 300, 70_000])
@pytest.mark.parametrize("attempt", [1, (7 << 32) | 3, (1 << 63) - 1])
def test_a_record_frame_sent_as_header_and_blob_reads_back_as_one_frame(
    size: int, attempt: int
) -> None:
    blob = bytes(range(256)) * (size // 256) + bytes(size % 256)
    header = row_header(3, 12345, 7, attempt, "completed", len(blob))
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(header + blob + msgpack.packb([CLOSE]))
    assert list(unpacker) == [[ROW, 3, 12345, 7, attempt, "completed", blob], [CLOSE]]


async def test_a_writer_that_cannot_be_started_is_a_typed_error_leaving_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(JournalError, match="writer process could not start"):
        async with Journal(tmp_path / "run.db"):
            pass
    assert set(os.listdir("/proc/self/fd")) <= before


async def test_a_durable_write_is_not_held_by_the_gathering(tmp_path: Path) -> None:
    # Records gather for a minute in this writer; a durable write behind them ends the
    # wait within milliseconds (the bound below is far under the minute, far over that).
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        (gid,) = journal.give([[sample(0)]], rollout_id=0)
        await journal.flush()
    writer = Writer(str(path), max_bytes=None, queue_size=8, gather_s=60.0)
    await writer.start()
    try:
        assert writer.row(gid, 0, 1, "completed", b"x", samples=1)
        await asyncio.sleep(0.2)  # the row reached the writer, which now gathers
        with anyio.fail_after(20):
            await writer.write_durably([])
        assert writer.statistics().samples == 1
    finally:
        await writer.close()


async def test_records_filling_half_the_queue_end_the_gathering(tmp_path: Path) -> None:
    # A writer that gathers for a minute commits two records at once when the queue takes
    # four: the loop would otherwise soon wait for room the whole minute.
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        (gid,) = journal.give([[sample(0), sample(1)]], rollout_id=0)
        await journal.flush()
    writer = Writer(str(path), max_bytes=None, queue_size=4, gather_s=60.0)
    await writer.start()
    try:
        assert writer.row(gid, 0, 1, "completed", b"x", samples=1)
        await asyncio.sleep(0.2)  # the first record reached the writer, which gathers
        assert writer.statistics().samples == 0
        assert writer.row(gid, 1, 1, "completed", b"y", samples=1)
        await wait_until(lambda: writer.statistics().samples == 2, timeout_s=20)
        assert writer.statistics().transactions == 1
    finally:
        await writer.close()
