"""The rollout journal: what a rollout makes, written to a SQLite file as it is made, so a
crashed trainer resumes exactly where it committed (see :mod:`miles_lite.training`).

:class:`Journal` owns the file and its one writer process
(:mod:`~miles_lite.training._writer`). The event loop only sends writes (a sample record
encoded on the loop, 10-18 us in C; statements and their rows otherwise: SQLite runs in the
writer, on another core, sharing no GIL with the loop) and waits on the disk in two places
the contract needs: a hand-off (a group is durable before the trainer gets it) and a
commit. Records: each group given (prompt id, seeds, a template sample), each
sample as its generate call ends (with the attempt that made it), each group's verdict,
each group handed (references to its sample records plus what scoring changed), each
step committed (with the digest of its training batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import sqlite3
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from miles_lite._core.resources import AsyncResource
from miles_lite.errors import ConfigError, JournalError
from miles_lite.training._schema import GROUP_KEY, connect, journal_error
from miles_lite.training._writer import Statements, Writer, WriterStatistics
from miles_lite.training.codec import encode_handed, encode_samples, encode_value
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.training.batch import TrainingBatch
    from miles_lite.training.reader import ResumeState

__all__ = ["Journal", "JournalConfig", "WriterStatistics", "config_fields", "prompt_digest"]

#: Settings that may change between the lives of one run (where the engines are, how
#: many workers, timeouts): left out of the run identity a journal checks.
_OPERATIONAL = frozenset(
    {
        "engines",
        "reward_workers",
        "reward_timeout_s",
        "stop_timeout_s",
        "tokenize_threads",
        "parser",
        "weight_update",
    }
)


@dataclass(frozen=True, kw_only=True)
class JournalConfig:
    """How a journal file is kept.

    - ``check``: on open, ``"quick"`` (``PRAGMA quick_check``, the default), ``"full"``
      (``integrity_check``) or ``"none"``: a torn or corrupt file is refused, never
      half-read;
    - ``max_bytes``: the most the file may grow to (``None``: the disk's room); past it a
      write fails the rollout with :class:`~miles_lite.errors.JournalError`, as a full
      disk does;
    - ``queue_size``: sample writes sent to the writer process and not yet applied, at
      most; a full queue makes the generate call that ended wait (counted:
      ``blocked_puts``);
    - ``stream_tokens_every``: when set (tokens, >= 1), a text sample's ``/generate``
      streams and the output so far is recorded each time this many more tokens came
      (ids, log-probs, weight version), so a sample in flight at a crash resumes from
      its last recorded token (``None``: samples are recorded when their call ends).
      The built-in single-turn generate function only (multi-turn and custom ones are
      recorded when their call ends), one output per request (``n`` 1);
    - ``stream_tokens_ms``: when set (milliseconds, > 0), a streamed sample is also
      recorded once this long passed since its last record (or since its request began),
      whichever of the two comes first; on its own it streams too (records by time only).
      Checked as each chunk comes (no timer): the engine is then asked for a chunk every
      ``stream_chunk_tokens`` tokens (at most ``stream_tokens_every``), so a record is late
      by at most one chunk;
    - ``stream_chunk_tokens``: the chunk size (``stream_interval``, tokens >= 1) asked of
      the engine when ``stream_tokens_ms`` is set; SGLang's chunks are cumulative, so
      small chunks cost bytes that grow with the square of the length.

    Usage: ``Journal("run.db", JournalConfig(max_bytes=2**30))``.
    """

    check: str = "quick"
    max_bytes: int | None = None
    queue_size: int = 4096
    stream_tokens_every: int | None = None
    stream_tokens_ms: float | None = None
    stream_chunk_tokens: int = 4

    @property
    def streams(self) -> bool:
        """Whether text samples stream their progress into the journal."""
        return self.stream_tokens_every is not None or self.stream_tokens_ms is not None

    def __post_init__(self) -> None:
        if self.check not in ("quick", "full", "none"):
            raise ConfigError(
                f"JournalConfig.check must be 'quick', 'full' or 'none', got {self.check!r}"
            )
        if self.max_bytes is not None and (
            isinstance(self.max_bytes, bool)
            or not isinstance(self.max_bytes, int)
            or self.max_bytes < 8192
        ):
            raise ConfigError(
                f"JournalConfig.max_bytes must be an int >= 8192 or None, got {self.max_bytes!r}"
            )
        if (
            isinstance(self.queue_size, bool)
            or not isinstance(self.queue_size, int)
            or (self.queue_size < 1)
        ):
            raise ConfigError(
                f"JournalConfig.queue_size must be an int >= 1, got {self.queue_size!r}"
            )
        every = self.stream_tokens_every
        if every is not None and (type(every) is not int or every < 1):
            raise ConfigError(
                f"JournalConfig.stream_tokens_every must be an int >= 1 or None, got {every!r}"
            )
        ms = self.stream_tokens_ms
        if ms is not None and (type(ms) not in (int, float) or not math.isfinite(ms) or ms <= 0):
            raise ConfigError(
                f"JournalConfig.stream_tokens_ms must be a number > 0 or None, got {ms!r}"
            )
        chunk = self.stream_chunk_tokens
        if type(chunk) is not int or chunk < 1:
            raise ConfigError(
                f"JournalConfig.stream_chunk_tokens must be an int >= 1, got {chunk!r}"
            )


def prompt_digest(prompt: Any) -> str:
    """A short digest of a prompt (text or chat messages), for the prompt set check."""
    return hashlib.sha256(encode_value(prompt)).hexdigest()[:24]


def config_fields(config: Any) -> dict[str, str]:
    """The run identity of a rollout config: ``repr`` of each field that decides what is
    generated (operational ones, such as engine settings, left out)."""
    return {
        f.name: repr(getattr(config, f.name))
        for f in dataclasses.fields(config)
        if f.name not in _OPERATIONAL
    }


class Journal(AsyncResource):
    """A rollout journal in the SQLite file at ``path`` (made if absent).

    ``async with Journal("run.db") as journal``, then pass it to a rollout's ``open``
    (``journal=journal``; a path there opens and closes one for you). Opening checks the
    file (:class:`JournalConfig` ``check``) and starts the writer process; closing applies
    what was sent and ends it. Raises :class:`~miles_lite.errors.JournalError`
    for a corrupt file or one of another schema version. Each open is a session: the
    attempt numbers of its requests are above those of every earlier session.
    """

    _resource_name = "journal"

    def __init__(self, path: str | os.PathLike[str], config: JournalConfig | None = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.config = config or JournalConfig()
        self.session = 0
        self._writer: Writer | None = None
        self._next_gid = 1
        self._attempts = 0
        self._prompts: dict[str, str] = {}
        self._steps: set[int] = set()
        self._bound: dict[str, str] | None = None
        #: Streamed progress records queued, and skipped (the queue was full).
        self.progress_written = 0
        self.progress_skipped = 0

    # -- lifetime --------------------------------------------------------------------

    async def _open(self) -> None:
        await anyio.to_thread.run_sync(self._connect)
        writer = Writer(
            self.path, max_bytes=self.config.max_bytes, queue_size=self.config.queue_size
        )
        await writer.start()
        self._writer = writer

    def _connect(self) -> None:
        """Check and open the file, start this session and read what the loop's side
        keeps (the next group id, the prompts and steps seen); the writer process opens
        its own connection."""
        conn = connect(self.path, check=self.config.check, max_bytes=self.config.max_bytes)
        try:
            cursor = conn.execute(
                "INSERT INTO sessions (opened, pid) VALUES (?, ?)", (time.time(), os.getpid())
            )
            self.session = int(cursor.lastrowid or 0)
            row = conn.execute("SELECT max(gid) FROM groups").fetchone()
            self._next_gid = (row[0] or 0) + 1
            self._prompts = dict(conn.execute("SELECT prompt_id, prompt_digest FROM groups"))
            self._steps = {row[0] for row in conn.execute("SELECT step FROM steps")}
        except sqlite3.Error as exc:
            raise journal_error(self.path, exc, "opening it") from exc
        finally:
            conn.close()

    async def _close(self) -> None:
        writer = self._writer
        if writer is not None:
            with anyio.CancelScope(shield=True):
                await writer.close()

    @property
    def writer(self) -> Writer:
        self._check_open()
        assert self._writer is not None
        return self._writer

    def statistics(self) -> WriterStatistics:
        """The writer's counters (see :class:`WriterStatistics`)."""
        return self.writer.statistics()

    # -- run identity ------------------------------------------------------------------

    async def bind(self, kind: str, config: Any) -> None:
        """Tie the file to one run: ``kind`` (``"text"``, ``"diffusion"``) and the config's
        identity (:func:`config_fields`). A new file records them; a file of another run
        raises :class:`~miles_lite.errors.JournalError` naming each field that differs."""
        fields = {"kind": kind, **config_fields(config)}
        self._check_open()
        value = await anyio.to_thread.run_sync(self._bind, fields)
        if value is not None:
            self.writer.statements([("INSERT INTO meta VALUES ('run', ?)", [(value,)])])
        self._bound = fields

    def _bind(self, fields: dict[str, str]) -> str | None:
        """The run's identity to record (a new file), or None (``fields`` match the
        file's); raises for a file of another run."""
        import json

        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        if row is None:
            return json.dumps(fields, sort_keys=True)
        recorded: dict[str, str] = json.loads(row[0])
        differs = [
            f"{name}: journal {recorded.get(name, '(absent)')}, now {fields.get(name, '(absent)')}"
            for name in sorted(set(recorded) | set(fields))
            if recorded.get(name) != fields.get(name)
        ]
        if differs:
            raise JournalError(
                f"journal {self.path} is of another run; what differs: "
                + "; ".join(differs)
                + ". Open a new journal file for a new run"
            )
        return None

    # -- records -----------------------------------------------------------------------

    def give(self, groups: Sequence[list[Sample]], rollout_id: int) -> list[int]:
        """Record the groups of one call (one id each, returned in order); a group carried
        over (its samples hold ``metadata["journal_group"]``) keeps its id. Raises
        :class:`~miles_lite.errors.JournalError` when a prompt id the journal knows comes
        with another prompt (a different prompt set)."""
        gids: list[int] = []
        rows: list[tuple[Any, ...]] = []
        for group in groups:
            first = group[0] if group else None
            known = None if first is None else first.metadata.get(GROUP_KEY)
            if isinstance(known, int):
                gids.append(known)
                continue
            gid = self._next_gid
            self._next_gid += 1
            gids.append(gid)
            if first is None:
                continue
            prompt_id = first.metadata.get("prompt_id")
            digest = prompt_digest(first.prompt)
            key = f"sha:{digest}" if prompt_id is None else str(prompt_id)
            seen = self._prompts.get(key)
            if seen is not None and seen != digest:
                raise JournalError(
                    f"journal {self.path}: prompt id {key!r} was journaled with another"
                    f" prompt (digest {seen}, now {digest}): a different prompt set; open"
                    " a new journal file for it"
                )
            self._prompts[key] = digest
            for sample in group:
                sample.metadata[GROUP_KEY] = gid
            seeds = array("q", [s.seed or 0 for s in group]).tobytes()
            template = encode_samples([first])
            rows.append((gid, key, digest, len(group), seeds, template, self.session, rollout_id))
        if rows:
            sql = "INSERT INTO groups VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)"
            self.writer.statements([(sql, rows)])
        return gids

    def next_attempt(self) -> int:
        """A new attempt number, above every earlier one (this session's and before)."""
        self._attempts += 1
        return (self.session << 32) | self._attempts

    async def record(self, gid: int, slot: int, attempt: int, samples: list[Sample]) -> None:
        """Record what the generate call ``attempt`` made for place ``slot`` of group
        ``gid`` (queued; waits only when the queue is full). A record of an older attempt
        never supersedes a newer one: the newest attempt of a place is the one read."""
        while not self.record_nowait(gid, slot, attempt, samples):
            await self.writer.wait_room()

    def record_nowait(self, gid: int, slot: int, attempt: int, samples: list[Sample]) -> bool:
        """:meth:`record` without waiting: False (nothing queued) when the queue is full,
        then await :meth:`record`. True also once the writer failed (nothing is queued:
        the hand-off raises its error; a generate call is no place to fail the run)."""
        writer = self.writer
        if writer.error is not None:
            return True
        status = samples[0].status.value if samples else "pending"
        # Encoded here, on the loop (10-18 us a 512-token sample of distinct ids and log-probs,
        # in C, by machine: the largest share of the journal's loop CPU): it crosses to the
        # writer process as bytes, and the sample is the one the call returned, not one the
        # scorer or the trainer changed since.
        blob = encode_samples(samples)
        return writer.row(gid, slot, attempt, status, blob, samples=len(samples))

    def progress(self, gid: int, slot: int, attempt: int, sample: Sample) -> bool:
        """Record ``sample`` in flight (its output so far, ABORTED) as place ``slot`` of
        group ``gid`` under ``attempt``, replacing that attempt's earlier progress; the
        call's own record replaces it when the call ends. Never waits: with the queue full
        it is skipped (False; ``progress_skipped`` counts it)."""
        blob = encode_samples([sample])
        writer = self.writer
        if writer.error is None and writer.row(
            gid, slot, attempt, sample.status.value, blob, samples=0
        ):
            self.progress_written += 1
            return True
        self.progress_skipped += 1
        return False

    def verdicts(self, verdicts: Sequence[tuple[int, str, str | None]]) -> None:
        """Record (group id, ``kept`` / ``filtered`` / ``partial``, reason) of groups."""
        if not verdicts:
            return
        rows = [(v, r, g) for g, v, r in verdicts]
        self.writer.statements([("UPDATE groups SET verdict = ?, reason = ? WHERE gid = ?", rows)])

    async def hand(
        self, groups: Sequence[tuple[int, list[Sample], list[tuple[int, int] | None]]]
    ) -> None:
        """Record ``(group id, samples, refs)`` as handed to the trainer and wait until
        durable. ``refs[k]``: the (place, attempt) under which sample ``k`` was recorded
        (:meth:`record`) if it was, so only what changed since is written again. Raises
        :class:`~miles_lite.errors.JournalError` when it cannot be written."""
        session = self.session
        statements: Statements = [
            (
                "INSERT INTO handed (gid, session, blob) VALUES (?, ?, ?)",
                [(gid, session, encode_handed(g, refs)) for gid, g, refs in groups],
            ),
            ("UPDATE groups SET verdict = 'handed' WHERE gid = ?", [(g,) for g, _, _ in groups]),
        ]
        await self.writer.write_durably(statements, samples=sum(len(g) for _, g, _ in groups))

    async def commit(self, step: int, batch: TrainingBatch | None = None) -> None:
        """Mark every group handed and not yet committed as consumed by ``step`` (call it
        after the trainer's own checkpoint of that step), with the digest of ``batch``
        (the :func:`~miles_lite.training.training_batch` trained on, for replay); waits
        until durable. Raises :class:`~miles_lite.errors.JournalError` when it cannot be
        written, or ``step`` was committed before."""
        from miles_lite.training.replay import batch_digest

        if step in self._steps:
            raise JournalError(f"journal {self.path}: step {step} was committed before")
        self._steps.add(step)
        digest = None if batch is None else batch_digest(batch)
        packed = int(batch is not None and batch.packed)
        dtype = None if batch is None else str(batch.rollout_log_probs.dtype).split(".")[-1]
        counted = "(SELECT count(*) FROM handed WHERE step IS NULL)"
        statements: Statements = [
            (
                f"INSERT INTO steps VALUES (?, ?, ?, ?, {counted}, ?, ?)",
                [(step, digest, packed, dtype, self.session, time.time())],
            ),
            ("UPDATE handed SET step = ? WHERE step IS NULL", [(step,)]),
        ]
        await self.writer.write_durably(statements)

    async def flush(self) -> None:
        """Wait until everything queued so far is durable."""
        await self.writer.write_durably([])

    # -- reading -----------------------------------------------------------------------

    async def resume(self) -> ResumeState:
        """What a restarted trainer needs (see :class:`~miles_lite.training.ResumeState`),
        read after everything queued is durable."""
        from miles_lite.training.reader import read_resume

        await self.flush()
        return await anyio.to_thread.run_sync(read_resume, self.path, "none")
