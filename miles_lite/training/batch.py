"""Kept groups into the tensors a trainer consumes: :func:`training_batch`.

Field names are miles' (``RolloutManager._convert_samples_to_train_data`` and its
trainer): ``tokens`` (prompt + response ids), ``response_lengths``, ``total_lengths``,
``loss_masks``, ``rollout_log_probs``, ``rewards`` (group-normalized, as miles'
``rewards_normalization`` with ``grpo_std_normalization``: ``(r - mean) / (std + 1e-6)``
over the group, ``std`` unbiased), ``raw_reward`` (as scored), ``advantages`` (GRPO: the
normalized reward on every token of the response), ``truncated``, ``sample_indices``.

Per-token fields are laid out along ``tokens``: position ``i`` of ``loss_masks``,
``rollout_log_probs`` and ``advantages`` is about token ``i`` (0 over the prompt and the
padding), so a trainer compares them with ``log_softmax(logits[:, :-1]).gather(tokens[:,
1:])`` against ``[:, 1:]``. Padded (``[B, T]``, right padding, ``attention_mask``) or
packed (``[1, N]``, ``cu_seqlens`` and ``position_ids`` restarting per sample, as
flash-attention's varlen kernels take).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miles_lite.errors import RewardError, SampleInvariantError
from miles_lite.rollout.filters import reward_value
from miles_lite.types import Sample, SampleStatus

if TYPE_CHECKING:
    import torch

__all__ = ["TrainingBatch", "group_advantages", "training_batch", "trains_on"]


@dataclass(frozen=True, kw_only=True)
class TrainingBatch:
    """The tensors of a batch of samples (see the module docstring for the layout).

    ``tokens``, ``position_ids`` (long) and ``attention_mask`` (long, 1 on real tokens)
    are ``[B, T]`` padded or ``[1, N]`` packed; so are ``loss_masks``,
    ``rollout_log_probs`` and ``advantages`` (float). ``rewards``, ``raw_reward`` (float),
    ``response_lengths``, ``total_lengths``, ``truncated``, ``sample_indices`` (long) have
    one entry per sample; ``cu_seqlens`` (int32, ``[B + 1]``) is set when packed.
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_masks: torch.Tensor
    rollout_log_probs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    raw_reward: torch.Tensor
    response_lengths: torch.Tensor
    total_lengths: torch.Tensor
    truncated: torch.Tensor
    sample_indices: torch.Tensor
    cu_seqlens: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        """Whether the samples are packed into one row."""
        return self.cu_seqlens is not None


def group_advantages(rewards: Sequence[float], *, std_normalize: bool = True) -> list[float]:
    """One group's normalized rewards, as miles computes them for GRPO:
    ``(r - mean) / (std + 1e-6)`` (``std`` unbiased; a group of one has std 0), or only
    ``r - mean`` without ``std_normalize``."""
    n = len(rewards)
    if n == 0:
        return []
    mean = math.fsum(rewards) / n
    centered = [r - mean for r in rewards]
    if not std_normalize:
        return centered
    std = math.sqrt(math.fsum(c * c for c in centered) / (n - 1)) if n > 1 else 0.0
    return [c / (std + 1e-6) for c in centered]


def trains_on(sample: Sample) -> bool:
    """Whether :func:`training_batch` trains on ``sample``: a COMPLETED or TRUNCATED
    sample, or an ABORTED one holding output (``response_length > 0``). A FAILED sample
    has no trustworthy output, a PENDING one none (never generated, or reset as stale),
    and an ABORTED one without a token nothing to learn from; none of them is counted in
    its group's reward normalization either."""
    status = sample.status
    if status is SampleStatus.COMPLETED or status is SampleStatus.TRUNCATED:
        return True
    return status is SampleStatus.ABORTED and sample.response_length > 0


def training_batch(
    groups: Sequence[Sequence[Sample]],
    *,
    pad_token_id: int = 0,
    pack: bool = False,
    reward_key: str | None = None,
    std_normalize: bool = True,
    dtype: torch.dtype | None = None,
) -> TrainingBatch:
    """The :class:`TrainingBatch` of ``groups`` (the kept groups of a run or a stream).

    A batch trains on the samples :func:`trains_on` takes, in group order: the model's
    answers (COMPLETED, TRUNCATED, and ABORTED with output: a partial answer an agent or
    a filter kept); FAILED samples, PENDING ones and ABORTED ones without a token are left
    out, and each group is normalized over exactly the samples it trains on
    (``sample_indices`` names them). Each is checked (:meth:`Sample.validate`) and needs
    a finite reward (``reward_key`` picks the entry of a dict reward). ``pad_token_id``
    fills the padding; ``pack`` puts every sample in one row; ``dtype`` of the float
    tensors (default float32). Raises :class:`~miles_lite.errors.RewardError` naming a
    sample whose reward is missing, not a number (a bool included) or not finite (NaN,
    inf: one would turn its whole group's advantages into NaN),
    :class:`~miles_lite.errors.SampleInvariantError` for a sample that breaks its
    invariants, ``ValueError`` when no sample is left.
    """
    import torch

    float_type = dtype if dtype is not None else torch.float32
    samples: list[Sample] = []
    raw: list[float] = []
    normalized: list[float] = []
    for group in groups:
        live = [s for s in group if trains_on(s)]
        values = []
        for sample in live:
            sample.validate()
            value = reward_value(sample, reward_key)
            if value is None or not math.isfinite(value):
                problem = "not a number" if value is None else "not finite"
                raise RewardError(
                    f"sample {sample.index} (group {sample.group_index}) has reward"
                    f" {sample.reward!r}, {problem}"
                    + (f" under reward_key {reward_key!r}" if reward_key else "")
                    + ": score it with a finite number before making a training batch",
                    request_id=sample.request_id,
                )
            values.append(value)
        samples += live
        raw += values
        normalized += group_advantages(values, std_normalize=std_normalize)
    if not samples:
        raise ValueError(
            "no sample to train on: every group was empty, or its samples FAILED, PENDING"
            " or ABORTED without a token"
        )

    rows_tokens, rows_mask, rows_logp, rows_adv = [], [], [], []
    for sample, advantage in zip(samples, normalized, strict=True):
        n = sample.response_length
        prompt = len(sample.tokens) - n
        mask = [float(m) for m in (sample.loss_mask if sample.loss_mask is not None else [1] * n)]
        log_probs = sample.rollout_log_probs
        if log_probs is None:
            raise SampleInvariantError(
                f"sample {sample.index} has no rollout_log_probs", request_id=sample.request_id
            )
        rows_tokens.append(list(sample.tokens))
        rows_mask.append([0.0] * prompt + mask)
        rows_logp.append([0.0] * prompt + [float(v) for v in log_probs])
        rows_adv.append([0.0] * prompt + [advantage * m for m in mask])

    lengths = [len(row) for row in rows_tokens]
    per_sample = {
        "rewards": torch.tensor(normalized, dtype=float_type),
        "raw_reward": torch.tensor(raw, dtype=float_type),
        "response_lengths": torch.tensor([s.response_length for s in samples], dtype=torch.long),
        "total_lengths": torch.tensor(lengths, dtype=torch.long),
        "truncated": torch.tensor(
            [int(s.status is SampleStatus.TRUNCATED) for s in samples], dtype=torch.long
        ),
        "sample_indices": torch.tensor([s.index for s in samples], dtype=torch.long),
    }
    if pack:
        flat = [t for row in rows_tokens for t in row]
        bounds = [0]
        for length in lengths:
            bounds.append(bounds[-1] + length)
        return TrainingBatch(
            tokens=torch.tensor([flat], dtype=torch.long),
            position_ids=torch.tensor([[i for n in lengths for i in range(n)]], dtype=torch.long),
            attention_mask=torch.ones(1, len(flat), dtype=torch.long),
            loss_masks=torch.tensor([[v for row in rows_mask for v in row]], dtype=float_type),
            rollout_log_probs=torch.tensor(
                [[v for row in rows_logp for v in row]], dtype=float_type
            ),
            advantages=torch.tensor([[v for row in rows_adv for v in row]], dtype=float_type),
            cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
            **per_sample,
        )
    width = max(lengths)

    def padded(
        rows: list[list[float]] | list[list[int]], fill: float, kind: torch.dtype
    ) -> torch.Tensor:
        return torch.tensor([row + [fill] * (width - len(row)) for row in rows], dtype=kind)

    return TrainingBatch(
        tokens=padded(rows_tokens, pad_token_id, torch.long),
        position_ids=torch.arange(width, dtype=torch.long).expand(len(samples), width).clone(),
        attention_mask=padded([[1] * n for n in lengths], 0, torch.long),
        loss_masks=padded(rows_mask, 0.0, float_type),
        rollout_log_probs=padded(rows_logp, 0.0, float_type),
        advantages=padded(rows_adv, 0.0, float_type),
        **per_sample,
    )
