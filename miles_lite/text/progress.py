"""Streamed progress of a text generation, for whoever records it as it comes (a rollout
journal): while a sink is set, the default generate function's one-output ``/generate``
streams, and the sample so far is handed to ``record`` every ``stream_tokens_every``
tokens or ``stream_tokens_ms`` milliseconds, whichever comes first (the time checked as
each chunk comes: no timer task).

The journal (``miles_lite.training``) sits below the text kind and is given
:func:`stream_progress` by :class:`~miles_lite.text.rollout.TextRollout`, so it never
imports the text kind.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from miles_lite.rollout.kind import RolloutKind
from miles_lite.sglang.generate_wire import GenerateAnswer
from miles_lite.text.kind import TextKind
from miles_lite.text.request import TOKEN_SINK, apply_answer
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.training.journal import JournalConfig

__all__ = ["stream_progress"]


class _SnapshotSink:
    """A :class:`~miles_lite.text.request.TokenSink` handing ``record`` the sample as
    sent plus the output so far, ABORTED (``status_reason`` ``"in_flight"``), so a resume
    continues it through the partial-rollout path.

    ``every_tokens`` is the chunk size asked of the engine (the request calls the sink
    once that many more tokens came); the sink records when ``record_tokens`` more tokens
    came since its last record, or ``record_s`` seconds passed since it (or since the
    sink was made, before the first), whichever comes first."""

    __slots__ = (
        "every_tokens",
        "last",
        "record",
        "record_s",
        "record_tokens",
        "recorded",
        "sample",
    )

    def __init__(
        self, sample: Sample, record: Callable[[Sample], None], config: JournalConfig
    ) -> None:
        self.sample, self.record = sample, record
        every, ms = config.stream_tokens_every, config.stream_tokens_ms
        self.record_tokens = every
        self.record_s = None if ms is None else ms / 1000.0
        chunk = config.stream_chunk_tokens
        self.every_tokens = (
            every if ms is None and every is not None else min(chunk, every or chunk)
        )
        self.recorded = 0
        self.last = time.monotonic()

    def __call__(self, partial: GenerateAnswer) -> None:
        n = len(partial.ids)
        if n < self.recorded:  # a new attempt: its stream starts again
            self.recorded = 0
        now = time.monotonic()
        every = self.record_tokens
        # A chunk as large as the count is the request's own count (it calls at most that
        # often, and counts a new attempt's stream from 0).
        by_count = every is not None and (every == self.every_tokens or n - self.recorded >= every)
        if not (by_count or (self.record_s is not None and now - self.last >= self.record_s)):
            return
        self.recorded, self.last = n, now
        # Copied: the call goes on with the original (its tokens hold the request's input).
        snapshot = copy.deepcopy(self.sample)
        apply_answer(snapshot, partial)
        snapshot.status_reason = "in_flight"
        self.record(snapshot)


@contextmanager
def _sink_set(sink: _SnapshotSink) -> Iterator[None]:
    token = TOKEN_SINK.set(sink)
    try:
        yield
    finally:
        TOKEN_SINK.reset(token)


def stream_progress(
    kind: RolloutKind, sample: Sample, record: Callable[[Sample], None], config: JournalConfig
) -> AbstractContextManager[None] | None:
    """A scope in which ``kind``'s generate call for ``sample`` streams, handing
    ``record`` the sample so far as ``config`` says (every ``stream_tokens_every`` tokens
    or ``stream_tokens_ms`` ms, whichever first); None when ``kind`` does not
    stream (only the text kind with the default generate function resumes streamed
    progress through its partial-rollout path)."""
    if not (isinstance(kind, TextKind) and kind.generate_fn is single_turn):
        return None
    return _sink_set(_SnapshotSink(sample, record, config))
