"""The journal's one writer thread: it takes writes from a bounded queue and applies them in
batched transactions (``synchronous=NORMAL``), switching to ``FULL`` for a transaction
that holds a durable write (a hand-off, a commit). Writes are closures the event loop
queues: encoding runs here, off the loop.

After a failed transaction (a full disk, an I/O error) the writer keeps the error, fails
that transaction's and every later write's future with it, and writes nothing more: the
file stays as its last complete transaction left it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from miles_lite.errors import JournalError
from miles_lite.training._schema import journal_error

__all__ = ["Write", "Writer", "WriterStatistics"]

#: Writes applied in one transaction at most.
_MAX_BATCH = 512


@dataclass(slots=True)
class Write:
    """One write: ``apply`` runs inside the writer's transaction; ``done`` (when set)
    resolves once that transaction is committed (durably when ``durable``)."""

    apply: Callable[[sqlite3.Connection], object]
    samples: int = 0
    durable: bool = False
    done: Future[None] | None = None
    #: Holds a place of the bounded room (sample writes; control writes do not).
    counted: bool = False


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
    writes waiting."""

    def __init__(
        self, conn: sqlite3.Connection, path: str | os.PathLike[str], *, queue_size: int
    ) -> None:
        self._conn = conn
        self._path = path
        # Sample writes take a place of ``room`` (freed once applied); a few control writes
        # per run (groups given, verdicts, hand-offs, commits) go in without one.
        self.queue: queue.Queue[Write | None] = queue.Queue()
        self.room = threading.BoundedSemaphore(queue_size)
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

    def put(self, write: Write) -> bool:
        """Queue ``write`` without waiting; False when a sample write finds no room (then
        :meth:`put_blocking` from a worker thread). Raises the writer's
        :class:`JournalError` once it failed."""
        if self.error is not None:
            raise self.error
        if write.counted and not self.room.acquire(blocking=False):
            return False
        self.queue.put_nowait(write)
        size = self.queue.qsize()
        if size > self.queue_max:
            self.queue_max = size
        return True

    def put_blocking(self, write: Write) -> None:
        """Queue sample write ``write``, waiting for room (call it from a worker thread):
        the back-pressure, counted in ``blocked_puts`` and ``blocked_s``."""
        t0 = time.monotonic()
        self.room.acquire()
        self.blocked_puts += 1
        self.blocked_s += time.monotonic() - t0
        self.queue.put_nowait(write)

    def close(self) -> None:
        """Apply what is queued, then end the thread and close the file (blocking)."""
        self.queue.put(None)
        self._thread.join()
        self._conn.close()

    def _loop(self) -> None:
        get = self.queue.get
        while True:
            first = get()
            if first is None:
                return
            batch = [first]
            closing = False
            while len(batch) < _MAX_BATCH:
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                    break
                batch.append(more)
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
                for write in batch:
                    write.apply(conn)
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
        for write in batch:
            if write.counted:
                self.room.release()
            if write.done is not None and not write.done.done():
                if self.error is None:
                    write.done.set_result(None)
                else:
                    write.done.set_exception(self.error)


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back what a failed transaction left (SQLite may have rolled it back itself)."""
    if conn.in_transaction:
        # The file keeps its last complete transaction either way.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
