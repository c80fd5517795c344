"""The journal's writer: a process of its own (:mod:`~miles_lite.training._writer_main`)
that applies the writes the event loop sends it in batched transactions
(``synchronous=NORMAL``; ``FULL`` for a transaction holding a durable write: a hand-off,
a commit).

Why a process: a writer thread shares the GIL with the event loop, and every hand-off
between them stalls the loop (generate@512 in ``benchmarks/journal.py``: a writer thread
that wrote nothing still cost 7-10% of the throughput; no writer at all, 1-7%). The
process writes on the other core; the loop only appends each write, msgpack-packed (a
sample record as a short header and its blob, not copied into a frame), to what it hands
to a pipe once a loop step (sample records within 5 ms; one ``writev`` for many), and
reads the writer's acknowledgements from a second pipe (a reader callback: no thread, no
await).

A write is data: a sample record's row, or statements (SQL and its rows, run with
``executemany``). Acknowledgements are cumulative: after each transaction the writer
says how many writes it has taken (and its counters); a durable write's future resolves
once its transaction is committed.

After a failed transaction (a full disk, an I/O error) the writer keeps the error, fails
that transaction's and every later write with it, and writes nothing more: the file stays
as its last complete transaction left it. When the writer process ends unexpectedly
(killed), the writes it did not acknowledge are lost (a durable one's wait fails) and
every later write raises a :class:`JournalError` saying so. The
writer dies with the process that started it (Linux: ``PR_SET_PDEATHSIG``; elsewhere when
it reads the end of its pipe), so no write of a dead run lands after a restart opened the
file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import sqlite3
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from functools import cache
from typing import Any

import anyio
import msgpack
import msgspec

from miles_lite.errors import JournalError
from miles_lite.training._schema import journal_error

__all__ = [
    "SAMPLE_INSERT",
    "Statements",
    "Writer",
    "WriterStatistics",
    "insert_rows",
    "row_header",
]

#: Where a sample record goes (a generate call's record, or streamed progress: a record of
#: the same place and attempt replaces it).
SAMPLE_INSERT = "INSERT OR REPLACE INTO samples VALUES (?, ?, ?, ?, ?)"

#: SQL and the rows it runs over (``executemany``), in order.
Statements = list[tuple[str, list[tuple[Any, ...]]]]

#: A write's kind, the first item of its frame: a sample record
#: ``[ROW, samples, gid, place, attempt, status, blob]``; statements
#: ``[STATEMENTS, durable, samples, [[sql, rows], ...]]``; the end ``[CLOSE]``.
ROW, STATEMENTS, CLOSE = 0, 1, 2

#: How large the loop asks the pipe to the writer to be (Linux; bytes): a burst of
#: 512-token records (about 8 KB each) fits without the loop waiting for room.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
#: How long a sample record waits at most for the pipe (seconds): the writer gathers
#: records for 20 ms before its transaction.
_RECORD_FLUSH_S = 0.005
#: Frames one ``writev`` takes at most (within every system's IOV_MAX).
_IOV_MAX = 512


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """What the writer did: ``writes``/``samples`` applied, ``transactions`` (``durable``
    of them with ``synchronous=FULL``), ``cpu_s`` of the writer process, ``queue_max``
    (most sample writes waiting at once), ``blocked_puts`` (writes the loop had to wait to
    queue: the back-pressure) and ``blocked_s`` (how long they waited, seconds)."""

    writes: int
    samples: int
    transactions: int
    durable: int
    cpu_s: float
    queue_max: int
    blocked_puts: int
    blocked_s: float


class Writer:
    """The writer process of the journal at ``path`` (see the module docstring), driven
    from the event loop: ``await start()``, then :meth:`row`, :meth:`statements`,
    :meth:`write_durably`, and ``await close()``. ``queue_size`` bounds the sample records
    sent and not yet applied; ``gather_s``: how long the writer lets writes gather into one
    transaction (a durable write ends the wait). Every method runs on the loop's thread."""

    def __init__(
        self, path: str, *, max_bytes: int | None, queue_size: int, gather_s: float = 0.02
    ) -> None:
        self._path = path
        self._gather_s = gather_s
        self._max_bytes = max_bytes
        self.limit = queue_size
        self.error: JournalError | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._data = self._acks = -1
        self._out: deque[bytes | memoryview] = deque()  # frames (their chunks) not yet sent
        self._flushing = False  # a flush is scheduled, or the loop waits for the pipe
        self._timer: asyncio.TimerHandle | None = None  # the records' flush, if it waits
        self.pipe_writes = 0  # writev calls that took bytes
        self._packer = msgpack.Packer(use_bin_type=True)
        self._unpacker = msgpack.Unpacker(raw=False)
        self._sent = 0  # writes sent
        self._taken = 0  # writes the writer took (applied, or failed with its error)
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._room: asyncio.Event | None = None
        self._ended: asyncio.Future[None] | None = None
        self._closing = False
        self._queued_rows = 0  # sample records sent
        self._applied_rows = 0  # sample records the writer took
        self.writes = self.samples = self.transactions = self.durable = 0
        self.cpu_s = 0.0
        self.queue_max = 0
        self.blocked_puts = 0
        self.blocked_s = 0.0

    # -- lifetime --------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer process; returns once it opened the file (or raises its
        :class:`JournalError`)."""
        loop = self._loop = asyncio.get_running_loop()
        self._room = asyncio.Event()
        self._ended = loop.create_future()
        data_r, self._data = os.pipe()
        self._acks, acks_w = os.pipe()
        with contextlib.suppress(OSError):  # not Linux, or above the system's limit
            fcntl.fcntl(self._data, _F_SETPIPE_SZ, _PIPE_BYTES)
        command = [
            sys.executable,
            "-m",
            "miles_lite.training._writer_main",
            self._path,
            str(self._max_bytes or 0),
            str(data_r),
            str(acks_w),
            str(os.getpid()),
            repr(self._gather_s),
            str(self.limit),
        ]
        try:
            # Started from the loop's thread, not a worker thread: PR_SET_PDEATHSIG
            # fires when the thread that started the child ends.
            self._process = await asyncio.create_subprocess_exec(
                *command, pass_fds=(data_r, acks_w), stdin=subprocess.DEVNULL
            )
        except BaseException as exc:
            os.close(self._data)
            os.close(self._acks)
            self._data = self._acks = -1
            if isinstance(exc, OSError):
                raise JournalError(
                    f"journal {self._path}: its writer process could not start: {exc}"
                ) from exc
            raise
        finally:
            os.close(data_r)
            os.close(acks_w)
        os.set_blocking(self._data, False)
        os.set_blocking(self._acks, False)
        loop.add_reader(self._acks, self._read_acks)
        ready: asyncio.Future[None] = loop.create_future()
        self._waiting.append((0, ready))  # the writer's first acknowledgement: it opened
        try:
            await ready
        except BaseException:
            with anyio.CancelScope(shield=True):  # reaped even when cancelled
                await self._end_process()
            raise

    async def close(self) -> None:
        """Apply what was sent, then end the process (waits for it)."""
        if self._process is None:
            return
        if self._ended is not None and not self._ended.done():
            self._closing = True
            self._send(self._packer.pack([CLOSE]))
            await asyncio.shield(self._ended)
        await self._end_process()

    async def _end_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None and self._acks >= 0:
            self._loop.remove_reader(self._acks)
            self._loop.remove_writer(self._data)
        if process.returncode is None and not self._closing:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                process.kill()  # it failed to start: nothing of it is waited for
        await process.wait()
        for fd in (self._data, self._acks):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._data = self._acks = -1

    @property
    def pid(self) -> int | None:
        """The writer process's id while it runs."""
        return None if self._process is None else self._process.pid

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

    # -- writes ------------------------------------------------------------------------

    def row(
        self, gid: int, place: int, attempt: int, status: str, blob: bytes, *, samples: int
    ) -> bool:
        """Send a sample record (no await); False when ``queue_size`` records wait already
        (nothing sent: ``await wait_room()``, then again). Raises the writer's
        :class:`JournalError` once it failed."""
        if self.error is not None:
            raise self.error
        waiting = self._queued_rows - self._applied_rows
        if waiting >= self.limit:
            return False
        self._queued_rows += 1
        if waiting >= self.queue_max:
            self.queue_max = waiting + 1
        self._send(row_header(samples, gid, place, attempt, status, len(blob)), blob, soon=False)
        return True

    def statements(self, statements: Statements, *, samples: int = 0) -> None:
        """Send statements to run in order in one transaction (a few a run: never refused
        for room). Raises the writer's :class:`JournalError` once it failed."""
        if self.error is not None:
            raise self.error
        self._send(self._packer.pack([STATEMENTS, False, samples, statements]))

    async def write_durably(self, statements: Statements, *, samples: int = 0) -> None:
        """Send statements and wait until their transaction (and everything sent before
        it) is committed with ``synchronous=FULL``. Raises the writer's
        :class:`JournalError` when it failed."""
        if self.error is not None:
            raise self.error
        assert self._loop is not None
        done: asyncio.Future[None] = self._loop.create_future()
        self._send(self._packer.pack([STATEMENTS, True, samples, statements]))
        self._waiting.append((self._sent, done))
        await done

    async def wait_room(self) -> None:
        """Wait until a sample record finds room: the back-pressure, counted in
        ``blocked_puts`` and ``blocked_s``. Returns at once once the writer failed
        (:meth:`row` raises it)."""
        assert self._room is not None
        t0 = time.monotonic()
        while self._queued_rows - self._applied_rows >= self.limit and self.error is None:
            self._room.clear()
            await self._room.wait()
        self.blocked_puts += 1
        self.blocked_s += time.monotonic() - t0

    # -- the pipes -----------------------------------------------------------------------

    def _send(self, *chunks: bytes, soon: bool = True) -> None:
        """Queue one write's frame, in ``chunks`` that follow one another in the pipe.
        The pipe takes it once this loop step ends (``soon``), or, for a sample record
        (the writer gathers them for its transaction anyway), within
        :data:`_RECORD_FLUSH_S`: one ``writev`` for more records (each costs the loop
        about 10 us besides the bytes)."""
        self._out.extend(chunks)
        self._sent += 1
        loop = self._loop
        assert loop is not None
        if not self._flushing:
            self._flushing = True
            if soon:
                loop.call_soon(self._flush)
            else:
                self._timer = loop.call_later(_RECORD_FLUSH_S, self._flush)
        elif soon and self._timer is not None:  # records wait for the timer: not this
            self._timer.cancel()
            self._timer = None
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Hand what was sent to the pipe, gathered (``writev``: no copy into one buffer);
        what the pipe has no room for waits for it to drain."""
        self._timer = None
        out = self._out
        while out and self._data >= 0:
            chunks = list(itertools.islice(out, _IOV_MAX))
            try:
                written = os.writev(self._data, chunks)
                self.pipe_writes += 1
            except BlockingIOError:
                break
            except OSError:  # the writer is gone: its end is read from the other pipe
                out.clear()
                break
            full = written < sum(map(len, chunks))
            while written and written >= len(out[0]):
                written -= len(out.popleft())
            if written:  # a frame taken in part
                out[0] = memoryview(out[0])[written:]
            if full:
                break
        if out and self._data >= 0:
            assert self._loop is not None
            self._loop.add_writer(self._data, self._flush_when_writable)
        else:
            self._flushing = False

    def _flush_when_writable(self) -> None:
        assert self._loop is not None
        self._loop.remove_writer(self._data)
        self._flush()

    def _read_acks(self) -> None:
        try:
            data = os.read(self._acks, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._writer_ended()
            return
        self._unpacker.feed(data)
        for ack in self._unpacker:
            self._take_ack(ack)

    def _take_ack(self, ack: list[Any]) -> None:
        (taken, rows, writes, samples, transactions, durable, cpu_s, error) = ack
        self._taken, self._applied_rows = taken, rows
        self.writes, self.samples = writes, samples
        self.transactions, self.durable, self.cpu_s = transactions, durable, cpu_s
        if error is not None and self.error is None:
            self.error = _error_of(self._path, error)
        waiting = self._waiting
        while waiting and waiting[0][0] <= taken:
            _, done = waiting.popleft()
            if not done.done():
                if self.error is None:
                    done.set_result(None)
                else:
                    done.set_exception(self.error)
        assert self._room is not None
        self._room.set()

    def _writer_ended(self) -> None:
        """The acknowledgements' pipe ended: the writer exited (after a close, or not)."""
        assert self._loop is not None and self._ended is not None and self._room is not None
        self._loop.remove_reader(self._acks)
        if not self._closing and self.error is None:
            code = None if self._process is None else self._process.returncode
            self.error = JournalError(
                f"journal {self._path}: its writer process ended unexpectedly (exit"
                f" status {code}); writes not acknowledged are lost (the file keeps its"
                " last complete transaction)"
            )
        while self._waiting:
            _, done = self._waiting.popleft()
            if not done.done():
                done.set_exception(self.error or JournalError(f"journal {self._path} closed"))
        self._room.set()
        if not self._ended.done():
            self._ended.set_result(None)


#: A sample record's frame, up to its blob: ``[ROW, samples, gid, place, attempt, status]``
#: encoded as an array of six, and its first byte made "array of seven" (both fixarray).
_HEADER_ENCODER = msgspec.msgpack.Encoder()
_FIXARRAY_7 = b"\x97"
_BIN32 = struct.Struct(">BI").pack


def row_header(samples: int, gid: int, place: int, attempt: int, status: str, size: int) -> bytes:
    """The frame ``[ROW, samples, gid, place, attempt, status, blob]`` up to the bytes of
    its ``size``-byte blob, which follow it in the pipe as they are: the record is not
    copied into a frame (2.6-3.3 us a 512-token sample on the loop, measured in the run,
    against 0.5 for this header)."""
    head = _HEADER_ENCODER.encode((ROW, samples, gid, place, attempt, status))
    return _FIXARRAY_7 + head[1:] + _BIN32(0xC6, size)


def _error_of(path: str, error: list[Any]) -> JournalError:
    """The typed error for what the writer process reported: ``[sqlite3 class name,
    SQLite's error code, message]`` for SQLite's errors, ``[None, None, repr]`` for any
    other (an encoding bug)."""
    name, code, message = error
    if name is None:
        return JournalError(f"journal {path}: a write raised {message}")
    kind = getattr(sqlite3, name, sqlite3.Error)
    exc = kind(message) if isinstance(kind, type) and issubclass(kind, sqlite3.Error) else None
    if exc is None:
        exc = sqlite3.Error(message)
    exc.sqlite_errorcode = code
    return journal_error(path, exc, "writing")


#: Sample rows inserted by one statement at most (5 values a row: within SQLite's 999
#: variables of versions before 3.32).
_ROWS_PER_INSERT = 64


@cache
def _multi_insert(n: int) -> str:
    """An ``INSERT OR REPLACE`` of ``n`` sample rows (one statement text per count, so
    SQLite's statement cache keeps them)."""
    return SAMPLE_INSERT + ", (?, ?, ?, ?, ?)" * (n - 1)


def insert_rows(conn: sqlite3.Connection, rows: list[list[Any]]) -> None:
    """Insert sample ``rows`` (gid, place, attempt, status, blob) in order, up to
    :data:`_ROWS_PER_INSERT` a statement. Rows of one statement apply in order: a later
    row of a place and attempt replaces an earlier one."""
    for start in range(0, len(rows), _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        conn.execute(_multi_insert(len(chunk)), [value for row in chunk for value in row])
