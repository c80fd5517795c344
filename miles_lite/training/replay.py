"""Replay: the training batch a trainer consumed at a step, rebuilt from the journal with no
engine, and its digest checked against the one journaled at commit.

The digest covers every tensor of the :class:`~miles_lite.training.TrainingBatch` (field
name, dtype, shape and bytes), so equal digests mean a bit-identical batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miles_lite.training.reader import read_step

if TYPE_CHECKING:
    from miles_lite.training.batch import TrainingBatch

__all__ = ["Replay", "batch_digest", "replay_step"]


def batch_digest(batch: TrainingBatch) -> str:
    """The SHA-256 of every tensor of ``batch`` (name, dtype, shape, bytes), hex."""
    import torch

    digest = hashlib.sha256()
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if value is None:
            digest.update(f"{field.name}:none;".encode())
            continue
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{field.name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Replay:
    """Step ``step`` replayed: the rebuilt ``batch``, its ``digest``, the ``journaled``
    digest (``None``: the step was committed without a batch), ``groups`` and ``samples``
    in it, and ``matches`` (the digests are equal)."""

    step: int
    batch: TrainingBatch
    digest: str
    journaled: str | None
    groups: int
    samples: int

    @property
    def matches(self) -> bool:
        return self.journaled is not None and self.digest == self.journaled


def replay_step(path: str | os.PathLike[str], step: int) -> Replay:
    """Rebuild the :func:`~miles_lite.training.training_batch` of committed ``step`` from
    the journal at ``path`` (the groups in the order they were handed, ``pack`` and
    ``dtype`` as committed). Blocking. Raises
    :class:`~miles_lite.errors.JournalError` when the step was never committed."""
    import torch

    from miles_lite.training.batch import training_batch

    record = read_step(path, step)
    dtype = getattr(torch, record.dtype) if record.dtype else None
    batch = training_batch(record.groups, pack=record.packed, dtype=dtype)
    return Replay(
        step=step,
        batch=batch,
        digest=batch_digest(batch),
        journaled=record.digest,
        groups=len(record.groups),
        samples=sum(len(g) for g in record.groups),
    )
