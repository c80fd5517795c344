"""Streamed progress of a text generation, for whoever records it as it comes (a rollout
journal): while a sink is set, the default generate function's one-output ``/generate``
streams, and every ``every`` tokens the sample so far is handed to ``record``.

The journal (``miles_lite.training``) sits below the text kind and is given
:func:`stream_progress` by :class:`~miles_lite.text.rollout.TextRollout`, so it never
imports the text kind.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from miles_lite.rollout.kind import RolloutKind
from miles_lite.sglang.generate_wire import GenerateAnswer
from miles_lite.text.kind import TextKind
from miles_lite.text.request import TOKEN_SINK, apply_answer
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.types import Sample

__all__ = ["stream_progress"]


class _SnapshotSink:
    """A :class:`~miles_lite.text.request.TokenSink` handing ``record`` the sample as
    sent plus the output so far, ABORTED (``status_reason`` ``"in_flight"``), so a resume
    continues it through the partial-rollout path."""

    __slots__ = ("every_tokens", "record", "sample")

    def __init__(self, sample: Sample, record: Callable[[Sample], None], every: int) -> None:
        self.sample, self.record, self.every_tokens = sample, record, every

    def __call__(self, partial: GenerateAnswer) -> None:
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
    kind: RolloutKind, sample: Sample, record: Callable[[Sample], None], every: int
) -> AbstractContextManager[None] | None:
    """A scope in which ``kind``'s generate call for ``sample`` streams, handing
    ``record`` the sample so far every ``every`` tokens; None when ``kind`` does not
    stream (only the text kind with the default generate function resumes streamed
    progress through its partial-rollout path)."""
    if not (isinstance(kind, TextKind) and kind.generate_fn is single_turn):
        return None
    return _sink_set(_SnapshotSink(sample, record, every))
