"""The journal's writer process (:mod:`~miles_lite.training._writer`):

    python -m miles_lite.training._writer_main PATH MAX_BYTES DATA_FD ACKS_FD PARENT GATHER_S QUEUE

Reads msgpack-packed writes from ``DATA_FD`` and applies them in one transaction a batch:
what came within ``GATHER_S`` of the first write of the batch (20 ms from the journal), or
less when a durable write or the close comes (held 2 ms at most), when half of the
``QUEUE`` sample records the loop may send unacknowledged have come (it would soon wait
for room), or when the batch holds :data:`_BATCH_BYTES`. Sample records not yet committed
at a crash are made again. After each transaction it writes a cumulative acknowledgement to
``ACKS_FD``: ``[writes taken, sample records taken, writes applied, samples applied,
transactions, durable transactions, CPU seconds since the file was open, error]`` (the
first one, all zeros, once the file is open). Ends after a ``CLOSE`` write, or at once
when its parent is gone (the pipe's end, or ``PR_SET_PDEATHSIG`` on Linux), with no
transaction left half-done that SQLite would not roll back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sqlite3
import sys
import time
from typing import Any

import msgpack

from miles_lite.training._writer import CLOSE, ROW, STATEMENTS, insert_rows

#: Bytes that end a batch's gathering: what one transaction holds at most, give or take a
#: read. Large enough that at generate@512 the 20 ms gather runs its course: each commit
#: rewrites the table's last pages, so fewer, larger transactions cost the writer less CPU
#: a record (44 against 48 us a sample with 256 KB, README "Surviving a crash").
_BATCH_BYTES = 1 << 22
#: How often a gathering writer looks for a durable write, seconds (its longest wait).
_LOOK_S = 0.002
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _connect(path: str, max_bytes: int) -> sqlite3.Connection:
    """The writer's connection (the loop's side made the file and its schema)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA synchronous=NORMAL")
    if max_bytes > 0:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={max(2, max_bytes // page)}")
    return conn


class _Applier:
    """The writer's state: its connection, counters and the first error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.taken = self.rows = 0
        self.writes = self.samples = self.transactions = self.durable = 0
        self.error: list[Any] | None = None
        self._cpu0 = time.process_time()  # not the interpreter's start: the writing

    def ack(self) -> bytes:
        return msgpack.packb(  # type: ignore[no-any-return]
            [
                self.taken,
                self.rows,
                self.writes,
                self.samples,
                self.transactions,
                self.durable,
                time.process_time() - self._cpu0,
                self.error,
            ],
            use_bin_type=True,
        )

    def apply(self, batch: list[list[Any]]) -> None:
        """Apply ``batch`` in one transaction (unless an earlier one failed)."""
        if self.error is None:
            durable = any(frame[0] == STATEMENTS and frame[1] for frame in batch)
            conn = self.conn
            try:
                if durable:
                    conn.execute("PRAGMA synchronous=FULL")
                conn.execute("BEGIN")
                _apply_in_order(conn, batch)
                conn.execute("COMMIT")
                if durable:
                    conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.Error as exc:
                _rollback(conn)
                self.error = [
                    type(exc).__name__,
                    getattr(exc, "sqlite_errorcode", None),
                    str(exc),
                ]
            except Exception as exc:  # an encoding bug: fail loudly, write nothing more
                _rollback(conn)
                self.error = [None, None, repr(exc)]
            else:
                self.transactions += 1
                self.durable += durable
                self.writes += len(batch)
                self.samples += sum(frame[1] if frame[0] == ROW else frame[2] for frame in batch)
        self.taken += len(batch)
        self.rows += _rows(batch)


def _apply_in_order(conn: sqlite3.Connection, batch: list[list[Any]]) -> None:
    """Apply ``batch`` in its order, each run of consecutive sample records inserted
    together (:func:`~miles_lite.training._writer.insert_rows`)."""
    rows: list[list[Any]] = []
    for frame in batch:
        if frame[0] == ROW:
            rows.append(frame[2:])
            continue
        if rows:
            insert_rows(conn, rows)
            rows = []
        for sql, params in frame[3]:
            conn.executemany(sql, params)
    if rows:
        insert_rows(conn, rows)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what a failed transaction left (SQLite may have rolled it back itself)."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):  # the file keeps its last complete one
            conn.execute("ROLLBACK")


def _rows(frames: list[list[Any]]) -> int:
    """How many of ``frames`` are sample records."""
    return sum(f[0] == ROW for f in frames)


def _urgent(frames: list[list[Any]]) -> bool:
    """Whether ``frames`` hold a durable write or the close (neither waits)."""
    return any(f[0] == CLOSE or (f[0] == STATEMENTS and f[1]) for f in frames)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(argv: list[str]) -> int:
    path, max_bytes, data_fd, acks_fd, parent, gather, queue = argv
    gather_s = float(gather)
    # Records that end the gathering: half of what the loop may send unacknowledged.
    enough_rows = max(1, int(queue) // 2)
    _die_with_parent(int(parent))
    data, acks = int(data_fd), int(acks_fd)
    try:
        applier = _Applier(_connect(path, int(max_bytes)))
    except sqlite3.Error as exc:
        error = [type(exc).__name__, getattr(exc, "sqlite_errorcode", None), str(exc)]
        _write_all(acks, msgpack.packb([0, 0, 0, 0, 0, 0, 0.0, error]))
        return 1
    _write_all(acks, applier.ack())
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=0)
    while True:
        chunk = os.read(data, 1 << 20)
        if not chunk:
            return 0  # the parent is gone without a close: nothing more is written
        unpacker.feed(chunk)
        batch = list(unpacker)
        got = len(chunk)
        if batch and not _urgent(batch):
            # Let more records come (one transaction for many), looking every few ms (not
            # at every loop step's write: a wake-up each costs CPU on the loop's cores)
            # whether a durable write or the close came, which end the wait.
            deadline = time.monotonic() + gather_s
            rows = _rows(batch)
            os.set_blocking(data, False)
            try:
                while (
                    got < _BATCH_BYTES
                    and rows < enough_rows
                    and (left := deadline - time.monotonic()) > 0
                ):
                    time.sleep(min(_LOOK_S, left))
                    try:
                        more = os.read(data, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not more:
                        return 0  # the parent is gone: nothing more is written
                    got += len(more)
                    unpacker.feed(more)
                    new = list(unpacker)
                    batch.extend(new)
                    rows += _rows(new)
                    if _urgent(new):
                        break
            finally:
                os.set_blocking(data, True)
        closing = bool(batch) and batch[-1][0] == CLOSE
        if closing:
            batch.pop()
        if batch:
            applier.apply(batch)
            _write_all(acks, applier.ack())
        if closing:
            applier.conn.close()
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
