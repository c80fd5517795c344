"""What a rollout tells a recorder of its runs (the journal of :mod:`miles_lite.training`
implements it): :class:`RunRecorder`. The rollout depends on this seam only, so the
journal, a layer above, is passed in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from miles_lite.rollout.kind import RolloutKind
from miles_lite.rollout.result import RolloutResult
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.rollout.batch import TrainingBatch

__all__ = ["RunRecorder"]


class RunRecorder(Protocol):
    """A recorder of a rollout's runs: groups given, samples made, groups handed (durably:
    awaited before the trainer gets them), verdicts, the trainer's commits, and what a
    restarted trainer resumes from."""

    def wrap(self, kind: RolloutKind) -> RolloutKind:
        """``kind``, with each generate call's samples recorded as it ends."""
        ...

    def begin(self, groups: Sequence[list[Sample]], rollout_id: int) -> None:
        """The groups of the call ``rollout_id`` are given (before any is started)."""
        ...

    async def hand(self, rollout_id: int, groups: Sequence[list[Sample]]) -> None:
        """``groups`` go to the trainer: returns once they are durable."""
        ...

    def end(self, rollout_id: int, result: RolloutResult) -> None:
        """The call ended with ``result`` (its kept groups handed)."""
        ...

    async def commit(self, step: int, batch: TrainingBatch | None) -> None:
        """The trainer consumed what was handed, as step ``step`` (durable on return)."""
        ...

    async def resume(self) -> object:
        """Where the recorded run stands, for a restarted trainer."""
        ...
