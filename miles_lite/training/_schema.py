"""The journal's SQLite file: its schema (versioned), opening it with the checks that keep a
torn or foreign file from being half-read, and translating SQLite's errors."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from miles_lite.errors import JournalError

__all__ = ["GROUP_KEY", "SCHEMA_VERSION", "connect", "journal_error"]

#: Bumped when a table changes; a file of another version is refused, never half-read.
SCHEMA_VERSION = 2  # 2: sample records by position, not keyed maps

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY, opened REAL NOT NULL, pid INTEGER);
CREATE TABLE IF NOT EXISTS groups (
    gid INTEGER PRIMARY KEY, prompt_id TEXT NOT NULL, prompt_digest TEXT NOT NULL,
    size INTEGER NOT NULL, seeds BLOB NOT NULL, template BLOB NOT NULL,
    session INTEGER NOT NULL, rollout_id INTEGER NOT NULL,
    verdict TEXT, reason TEXT);
CREATE INDEX IF NOT EXISTS groups_prompt ON groups (prompt_id);
CREATE TABLE IF NOT EXISTS samples (
    gid INTEGER NOT NULL, slot INTEGER NOT NULL, attempt INTEGER NOT NULL,
    status TEXT NOT NULL, blob BLOB NOT NULL, PRIMARY KEY (gid, slot, attempt));
CREATE TABLE IF NOT EXISTS handed (
    seq INTEGER PRIMARY KEY, gid INTEGER NOT NULL, session INTEGER NOT NULL,
    blob BLOB NOT NULL, step INTEGER);
CREATE INDEX IF NOT EXISTS handed_step ON handed (step);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY, digest TEXT, packed INTEGER NOT NULL, dtype TEXT,
    groups INTEGER NOT NULL, session INTEGER NOT NULL, committed REAL NOT NULL);
"""

#: The page size of a new journal file, bytes.
_PAGE_BYTES = 32768

#: SQLite's primary result codes for "the disk (or max_page_count) is full".
_FULL_CODES = {13}  # SQLITE_FULL


def journal_error(path: str | os.PathLike[str], exc: sqlite3.Error, doing: str) -> JournalError:
    """The typed error for SQLite's ``exc`` while ``doing`` something on ``path``."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _FULL_CODES:
        what = (
            f"journal {path} is full while {doing} (the disk, or its max_bytes): the file"
            f" stays readable up to its last complete transaction; free space and resume"
        )
    elif isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        what = f"journal {path} is corrupt ({exc}) while {doing}: it is not read further"
    else:
        what = f"journal {path} failed while {doing}: {exc}"
    error = JournalError(what)
    error.__cause__ = exc
    return error


def connect(
    path: str | os.PathLike[str],
    *,
    check: str,
    max_bytes: int | None,
    create: bool = True,
) -> sqlite3.Connection:
    """Open the journal at ``path`` (WAL, ``synchronous=NORMAL``), checked by ``check``
    (``quick``: ``PRAGMA quick_check``; ``full``: ``integrity_check``; ``none``), its
    schema created or its version checked. Blocking: call it off the event loop.

    Raises :class:`JournalError` for a file that is not a journal of this version, a
    corrupt one (naming what the check found), or ``create=False`` and no file.
    """
    if not create and not Path(path).is_file():
        raise JournalError(f"no journal at {path}")
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise journal_error(path, exc, "opening it") from exc
    try:
        if check != "none":
            pragma = "quick_check" if check == "quick" else "integrity_check"
            found = [row[0] for row in conn.execute(f"PRAGMA {pragma}(5)")]
            if found != ["ok"]:
                raise JournalError(
                    f"journal {path} is corrupt ({pragma}: {'; '.join(found)}): it is not read;"
                    " restore it from a copy or start a new one"
                )
        # 32 KiB pages for a new file: a 512-token sample (~10 KB) then fits in one page
        # instead of a chain of overflow pages: its insert costs 2x less writer CPU, and a
        # durable commit stays well under a millisecond. (An existing file keeps its own.)
        conn.execute(f"PRAGMA page_size={_PAGE_BYTES}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if max_bytes is not None:
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={max(2, max_bytes // page)}")
        conn.executescript(_TABLES)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise JournalError(
                f"journal {path} has schema version {row[0]}, this miles_lite writes"
                f" {SCHEMA_VERSION}: open it with the version that wrote it"
            )
    except JournalError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise journal_error(path, exc, "opening it") from exc
    return conn


#: The metadata key that carries a group's journal id on its samples (a carried-over
#: group, from ``result.partial`` or a resume, keeps its record).
GROUP_KEY = "journal_group"
