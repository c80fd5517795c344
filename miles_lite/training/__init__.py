"""The trainer's side of a rollout: the :class:`Rollout` a trainer holds (``run``,
``stream``, ``commit``, ``update_weights``), the groups it streams
(:class:`GroupStream`), the one staleness gate both ``run`` and ``stream`` apply
(:mod:`miles_lite.training.staleness`), training batches (:func:`training_batch`), and
the journal that makes a run survive a crash. The driver core they build on is
:mod:`miles_lite.rollout`, one floor down.

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

from miles_lite._core.lazy import lazy_exports as _lazy_exports

# Imported when first used: the kinds import the facade (training.rollout) and need not
# load the journal's modules with it.
_EXPORTS: dict[str, list[str]] = {
    "miles_lite.engine.updates": ["WeightUpdateConfig", "WeightUpdateReport"],
    "miles_lite.training._writer": ["WriterStatistics"],
    "miles_lite.training.batch": ["TrainingBatch", "group_advantages", "training_batch"],
    "miles_lite.training.journal": ["Journal", "JournalConfig"],
    "miles_lite.training.reader": ["ResumeState", "StepRecord", "read_resume", "read_step"],
    "miles_lite.training.replay": ["Replay", "batch_digest", "replay_step"],
    "miles_lite.training.rollout": ["Rollout"],
    "miles_lite.training.staleness": ["group_lag", "staleness_metrics"],
    "miles_lite.training.stream": ["GroupStream", "StreamStatistics"],
}
__getattr__, __dir__, __all__ = _lazy_exports(__name__, _EXPORTS)
