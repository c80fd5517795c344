"""Reading a journal back: what a restarted trainer resumes from (:func:`read_resume`), the
groups of one committed step (:func:`read_step`), and every handed group
(:func:`iter_handed`). Blocking SQLite reads: call them off the event loop (the rollout's
``resume()`` does). A file is checked before it is read (``quick_check``), never half-read.
"""

from __future__ import annotations

import copy
import os
import sqlite3
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from miles_lite.errors import JournalError
from miles_lite.training._schema import GROUP_KEY, connect, journal_error
from miles_lite.training.codec import decode_samples, handed_entries, is_reference, resolve_entry
from miles_lite.types import Sample, SampleStatus

__all__ = [
    "ResumeState",
    "StepRecord",
    "handed_group",
    "iter_handed",
    "open_reader",
    "read_resume",
    "read_step",
]

#: Statuses of a journaled sample that needs no more generation.
_DONE = {SampleStatus.COMPLETED, SampleStatus.TRUNCATED}


@dataclass(frozen=True, kw_only=True)
class ResumeState:
    """Where a journaled run stands, for a restarted trainer.

    - ``step``: the last step committed (``None``: none yet): restore the trainer's own
      checkpoint of that step;
    - ``handed``: the groups handed after that commit, in the order they were handed:
      train on them first, as they are (they are not generated again); the next commit
      marks them consumed;
    - ``pending``: groups given and never handed (not filtered): pass them to the next
      ``run()``/``stream()``; their finished samples are kept, aborted ones resume from
      their journaled tokens, the rest are generated again;
    - ``given``: the prompt ids of every group ever given (leave them out of the next
      prompts: they are handed, pending, or were filtered);
    - ``committed_prompts``: the prompt id of each group committed, once per group.
    """

    step: int | None
    handed: list[list[Sample]] = field(default_factory=list)
    pending: list[list[Sample]] = field(default_factory=list)
    given: frozenset[str] = frozenset()
    committed_prompts: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """A committed step: its ``groups`` as handed (hand order), the ``digest`` of the
    training batch the trainer committed with it (``None`` if none), ``packed`` and
    ``dtype`` of that batch."""

    step: int
    groups: list[list[Sample]]
    digest: str | None
    packed: bool
    dtype: str | None


def handed_group(conn: sqlite3.Connection, gid: int, blob: bytes, group_index: int) -> list[Sample]:
    """The samples of handed group ``gid`` (its hand-off ``blob``), each reference resolved
    to the sample record it names. Raises :class:`JournalError` for a reference the file
    does not hold."""
    out = []
    for entry in handed_entries(blob):
        referenced = None
        if is_reference(entry):
            row = conn.execute(
                "SELECT blob FROM samples WHERE gid = ? AND slot = ? AND attempt = ?",
                (gid, entry[0], entry[1]),
            ).fetchone()
            referenced = None if row is None else row[0]
        out.append(resolve_entry(entry, referenced, group_index))
    return out


def open_reader(path: str | os.PathLike[str], *, check: str = "quick") -> sqlite3.Connection:
    """A connection to read the journal at ``path`` (checked; no file: JournalError)."""
    return connect(path, check=check, max_bytes=None, create=False)


def read_resume(path: str | os.PathLike[str], check: str = "quick") -> ResumeState:
    """The :class:`ResumeState` of the journal at ``path``, checked first (``check``: as
    :class:`~miles_lite.training.JournalConfig`'s; an open :class:`Journal` passes
    ``"none"``: it checked the file when it opened it)."""
    conn = open_reader(path, check=check)
    try:
        return _resume(conn)
    except sqlite3.Error as exc:
        raise journal_error(path, exc, "reading it") from exc
    finally:
        conn.close()


def _resume(conn: sqlite3.Connection) -> ResumeState:
    step = conn.execute("SELECT max(step) FROM steps").fetchone()[0]
    handed = [
        handed_group(conn, gid, blob, g)
        for g, (gid, blob) in enumerate(
            conn.execute("SELECT gid, blob FROM handed WHERE step IS NULL ORDER BY seq").fetchall()
        )
    ]
    committed = [
        row[0]
        for row in conn.execute(
            "SELECT g.prompt_id FROM handed h JOIN groups g USING (gid)"
            " WHERE h.step IS NOT NULL ORDER BY h.seq"
        )
    ]
    given = frozenset(row[0] for row in conn.execute("SELECT prompt_id FROM groups"))
    open_groups = conn.execute(
        "SELECT gid, size, seeds, template FROM groups WHERE (verdict IS NULL OR verdict IN"
        " ('kept', 'partial')) AND gid NOT IN (SELECT gid FROM handed) ORDER BY gid"
    ).fetchall()
    latest: dict[tuple[int, int], bytes] = {}
    # SQLite takes the bare columns of a max() aggregate from the row holding the max:
    # the newest attempt of each place, whatever order older attempts' answers came in.
    for gid, slot, blob, _ in conn.execute(
        "SELECT gid, slot, blob, max(attempt) FROM samples WHERE gid IN"
        " (SELECT gid FROM groups WHERE verdict IS NULL OR verdict IN ('kept', 'partial'))"
        " GROUP BY gid, slot"
    ):
        latest[(gid, slot)] = blob
    pending = []
    for g, (gid, size, seeds_blob, template_blob) in enumerate(open_groups):
        seeds = array("q")
        seeds.frombytes(seeds_blob)
        template = decode_samples(template_blob, g)[0]
        group: list[Sample] = []
        for slot in range(size):
            blob = latest.get((gid, slot))
            made = [] if blob is None else decode_samples(blob, g)
            if made and all(_resumable(s) for s in made):
                group += made
            else:
                group.append(_fresh(template, slot, size, seeds[slot], g, gid))
        pending.append(group)
    return ResumeState(
        step=step,
        handed=handed,
        pending=pending,
        given=given,
        committed_prompts=committed,
    )


def _resumable(sample: Sample) -> bool:
    """A journaled sample kept as it is: finished, or aborted with output to resume from."""
    return sample.status in _DONE or (
        sample.status is SampleStatus.ABORTED and sample.response_length > 0
    )


def _fresh(template: Sample, slot: int, size: int, seed: int, g: int, gid: int) -> Sample:
    """Place ``slot`` of a group, not yet generated: the group's prompt and seed."""
    return Sample(
        index=g * size + slot,
        group_index=g,
        prompt=copy.deepcopy(template.prompt),
        label=copy.deepcopy(template.label),
        seed=seed,
        metadata={**copy.deepcopy(template.metadata), GROUP_KEY: gid},
    )


def read_step(path: str | os.PathLike[str], step: int) -> StepRecord:
    """Committed step ``step`` of the journal at ``path``; :class:`JournalError` when it
    was never committed."""
    conn = open_reader(path)
    try:
        row = conn.execute(
            "SELECT digest, packed, dtype FROM steps WHERE step = ?", (step,)
        ).fetchone()
        if row is None:
            steps = [r[0] for r in conn.execute("SELECT step FROM steps ORDER BY step")]
            shown = f"{steps[:3]}...{steps[-3:]}" if len(steps) > 6 else str(steps)
            raise JournalError(f"journal {path} has no committed step {step} (steps: {shown})")
        rows = conn.execute(
            "SELECT gid, blob FROM handed WHERE step = ? ORDER BY seq", (step,)
        ).fetchall()
        groups = [handed_group(conn, gid, blob, g) for g, (gid, blob) in enumerate(rows)]
        return StepRecord(
            step=step, groups=groups, digest=row[0], packed=bool(row[1]), dtype=row[2]
        )
    except sqlite3.Error as exc:
        raise journal_error(path, exc, "reading it") from exc
    finally:
        conn.close()


def iter_handed(
    conn: sqlite3.Connection,
) -> Iterator[tuple[int, str, int | None, list[Sample]]]:
    """Every handed group: (group id, prompt id, step or ``None``, samples), hand order."""
    rows = conn.execute(
        "SELECT h.gid, g.prompt_id, h.step, h.blob FROM handed h JOIN groups g USING (gid)"
        " ORDER BY h.seq"
    ).fetchall()
    for seq, (gid, prompt_id, step, blob) in enumerate(rows):
        yield gid, prompt_id, step, handed_group(conn, gid, blob, seq)
