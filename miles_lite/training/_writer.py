"""The journal's one writer thread: it takes writes from a bounded queue and applies them in
batched transactions (``synchronous=NORMAL``), switching to ``FULL`` for a transaction
that holds a durable write (a hand-off, a commit). Writes are closures the event loop
queues (sample records come encoded; hand-offs and group templates are encoded here).

After a failed transaction (a full disk, an I/O error) the writer keeps the error, fails
that transaction's and every later write's future with it, and writes nothing more: the
file stays as its last complete transaction left it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cache

from miles_lite.errors import JournalError
from miles_lite.training._schema import journal_error

__all__ = ["SAMPLE_INSERT", "SampleRow", "Write", "Writer", "WriterStatistics"]

#: Writes applied in one transaction at most.
_MAX_BATCH = 512
#: How long the writer lets sample writes gather after it wakes, seconds.
_GATHER_S = 0.002


#: Where a sample record goes (a generate call's record, or streamed progress: a record of
#: the same place and attempt replaces it).
SAMPLE_INSERT = "INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?)"

#: A sample record's row: (group id, place, attempt, status, encoded samples).
SampleRow = tuple[int, int, int, str, bytes]


@dataclass(slots=True)
class Write:
    """One write: ``apply`` runs inside the writer's transaction, or (``apply`` None) the
    sample record ``row`` is inserted (consecutive rows in one ``executemany``: one call
    for many, not a closure and a statement per sample); ``done`` (when set) resolves once
    that transaction is committed (durably when ``durable``)."""

    apply: Callable[[sqlite3.Connection], object] | None
    samples: int = 0
    durable: bool = False
    done: Future[None] | None = None
    #: Holds a place of the bounded room (sample writes; control writes do not).
    counted: bool = False
    row: SampleRow | None = None


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """What the writer did: ``writes``/``samples`` applied, ``transactions`` (``durable``
    of them with ``synchronous=FULL``), ``cpu_s`` of the writer thread, ``queue_max``
    (most writes waiting at once), ``blocked_puts`` (writes the loop had to wait to queue:
    the back-pressure) and ``blocked_s`` (how long they waited, seconds)."""

    writes: int
    samples: int
    transactions: int
    durable: int
    cpu_s: float
    queue_max: int
    blocked_puts: int
    blocked_s: float


class Writer:
    """The writer thread over ``conn`` (see the module docstring); ``queue_size`` bounds the
    sample writes waiting.

    The hand-over is a deque (an append: no lock, no syscall) and an event the loop sets
    only when the writer sleeps; the writer re-checks the deque after saying it sleeps, so
    no write is left waiting. The room is two counters, each written by one thread only
    (sample writes queued by the loop, applied by the writer).
    """

    def __init__(
        self, conn: sqlite3.Connection, path: str | os.PathLike[str], *, queue_size: int
    ) -> None:
        self._conn = conn
        self._path = path
        self.limit = queue_size
        self.pending: deque[Write | None] = deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._urgent = False  # a write someone waits for is queued: no gathering pause
        self._applied_event = threading.Event()  # set after each transaction
        self._queued_samples = 0  # sample writes queued (the loop's counter)
        self._applied_samples = 0  # sample writes applied (the writer's counter)
        self.error: JournalError | None = None
        self.writes = self.samples = self.transactions = self.durable = 0
        self.cpu_s = 0.0
        self.queue_max = 0
        self.blocked_puts = 0
        self.blocked_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="miles-lite journal", daemon=True)
        self._thread.start()

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            writes=self.writes,
            samples=self.samples,
            transactions=self.transactions,
            durable=self.durable,
            cpu_s=self.cpu_s,
            queue_max=self.queue_max,
            blocked_puts=self.blocked_puts,
            blocked_s=self.blocked_s,
        )

    def _push(self, write: Write | None) -> None:
        self.pending.append(write)
        if write is None or write.done is not None:
            self._urgent = True
        if self._sleeping:
            self._sleeping = False
            self._wake.set()

    def put(self, write: Write) -> bool:
        """Queue ``write`` without waiting (from the event loop only); False when a sample
        write finds no room (then :meth:`wait_room` in a worker thread). Raises the writer's
        :class:`JournalError` once it failed."""
        if self.error is not None:
            raise self.error
        if write.counted:
            waiting = self._queued_samples - self._applied_samples
            if waiting >= self.limit:
                return False
            self._queued_samples += 1
            if waiting >= self.queue_max:
                self.queue_max = waiting + 1
        self._push(write)
        return True

    def wait_room(self) -> None:
        """Wait until a sample write finds room (call it from a worker thread, then
        :meth:`put` again from the loop): the back-pressure, counted in ``blocked_puts``
        and ``blocked_s``. Returns at once once the writer failed (``put`` raises it)."""
        t0 = time.monotonic()
        while self._queued_samples - self._applied_samples >= self.limit and self.error is None:
            self._applied_event.wait(0.05)
            self._applied_event.clear()
        self.blocked_puts += 1
        self.blocked_s += time.monotonic() - t0

    def close(self) -> None:
        """Apply what is queued, then end the thread and close the file (blocking)."""
        self._push(None)
        self._thread.join()
        self._conn.close()

    def _next_batch(self) -> tuple[list[Write], bool]:
        """Wait for writes; take up to ``_MAX_BATCH``; True when the close came."""
        pending = self.pending
        while not pending:
            self._sleeping = True
            if pending:  # appended before the loop saw us sleeping
                self._sleeping = False
                break
            self._wake.wait(0.5)
            self._wake.clear()
            self._sleeping = False
            if not self._urgent:
                # Let sample writes gather for a moment (the GIL is free meanwhile): one
                # wake-up and one transaction for many, not a thread switch per sample.
                time.sleep(_GATHER_S)
        self._urgent = False
        batch: list[Write] = []
        while pending and len(batch) < _MAX_BATCH:
            write = pending.popleft()
            if write is None:
                return batch, True
            batch.append(write)
        return batch, False

    def _loop(self) -> None:
        while True:
            batch, closing = self._next_batch()
            if batch:
                self._apply(batch)
            if closing:
                return

    def _apply(self, batch: list[Write]) -> None:
        t0 = time.thread_time()
        if self.error is None:
            durable = any(w.durable for w in batch)
            conn = self._conn
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
                self.error = journal_error(self._path, exc, "writing")
            except Exception as exc:  # an encoding bug: fail loudly, write nothing more
                _rollback(conn)
                self.error = JournalError(f"journal {self._path}: a write raised {exc!r}")
                self.error.__cause__ = exc
            else:
                self.transactions += 1
                self.durable += durable
                self.writes += len(batch)
                self.samples += sum(w.samples for w in batch)
        self.cpu_s += time.thread_time() - t0
        self._applied_samples += sum(w.counted for w in batch)
        self._applied_event.set()
        for write in batch:
            if write.done is not None and not write.done.done():
                if self.error is None:
                    write.done.set_result(None)
                else:
                    write.done.set_exception(self.error)


def _apply_in_order(conn: sqlite3.Connection, batch: list[Write]) -> None:
    """Apply ``batch`` in its order, each run of consecutive sample rows inserted together
    (:func:`_insert_rows`)."""
    rows: list[SampleRow] = []
    for write in batch:
        apply = write.apply
        if apply is None:
            if write.row is not None:
                rows.append(write.row)
            continue
        if rows:
            _insert_rows(conn, rows)
            rows = []
        apply(conn)
    if rows:
        _insert_rows(conn, rows)


#: Sample rows inserted by one statement at most (5 values a row: within SQLite's 999
#: variables of versions before 3.32).
_ROWS_PER_INSERT = 64


@cache
def _multi_insert(n: int) -> str:
    """An ``INSERT OR REPLACE`` of ``n`` sample rows (one statement text per count, so
    SQLite's statement cache keeps them)."""
    return SAMPLE_INSERT + ", (?, ?, ?, ?, ?)" * (n - 1)


def _insert_rows(conn: sqlite3.Connection, rows: list[SampleRow]) -> None:
    """Insert ``rows`` in order, up to :data:`_ROWS_PER_INSERT` a statement: the sqlite3
    module lets go of the GIL around each statement it steps, and this thread taking it
    back makes the event loop's thread wait for it (two thread switches); one statement
    for many rows is one such wait, not one a sample. Rows of one statement apply in
    order: a later row of a place and attempt replaces an earlier one."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        conn.execute(_multi_insert(len(chunk)), [value for row in chunk for value in row])


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what a failed transaction left (SQLite may have rolled it back itself)."""
    if conn.in_transaction:
        # The file keeps its last complete transaction either way.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
