"""The trainer's side of a rollout: the journal that makes a run survive a crash.

A rollout opened with ``journal="run.db"`` (or a :class:`Journal`) records what it makes
in a SQLite file as it makes it: the groups given, each sample as its generate call ends,
each group's verdict, each group handed to the trainer (durable before the trainer gets
it), each step the trainer commits. After a crash, the same file and
``rollout.resume()`` give back exactly what was handed after the last commit, and what
was given and never handed, with its finished and partial samples
(:class:`ResumeState`). :func:`replay_step` rebuilds the training batch of a committed
step bit for bit with no engine; :mod:`miles_lite.cli.journal` shows, exports, replays
and audits a journal (``miles-lite journal ...``).

Usage::

    async with TextRollout.open(urls, tokenizer=tok, config=config, journal="run.db") as rollout:
        state = await rollout.resume()        # step, handed, pending, given
        ...                                   # train on state.handed first
        async with rollout.stream(state.pending + new_prompts) as groups:
            async for group in groups:        # durable in the journal before it comes
                ...
                await rollout.commit(step, batch=data)   # after the trainer's checkpoint
"""

from __future__ import annotations

from miles_lite.training._writer import WriterStatistics
from miles_lite.training.journal import Journal, JournalConfig
from miles_lite.training.reader import ResumeState, StepRecord, read_resume, read_step
from miles_lite.training.replay import Replay, batch_digest, replay_step

__all__ = [
    "Journal",
    "JournalConfig",
    "Replay",
    "ResumeState",
    "StepRecord",
    "WriterStatistics",
    "batch_digest",
    "read_resume",
    "read_step",
    "replay_step",
]
