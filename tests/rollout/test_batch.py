"""Kept groups into training tensors, with miles' field names and GRPO's group-normalized
advantages (pure)."""

from __future__ import annotations

import math

import pytest
import torch

from miles_lite.errors import EngineStatusError, RewardError
from miles_lite.rollout.batch import group_advantages, training_batch
from miles_lite.types import Sample, SampleStatus


def sample(
    index: int, prompt: list[int], out: list[int], reward: float | None, **kw: object
) -> Sample:
    made = Sample(
        index=index,
        group_index=index // 10,
        tokens=[*prompt, *out],
        response_length=len(out),
        loss_mask=[1] * len(out),
        rollout_log_probs=[-0.5 - i for i in range(len(out))],
        status=SampleStatus.COMPLETED,
        reward=reward,
    )
    for key, value in kw.items():
        setattr(made, key, value)
    return made


def test_advantages_are_miles_group_normalized_rewards() -> None:
    rewards = [1.0, 0.0, 0.5, 0.5]
    mean = 0.5
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)  # unbiased, as torch.std
    expected = [(r - mean) / (std + 1e-6) for r in rewards]
    assert group_advantages(rewards) == pytest.approx(expected)
    assert torch.tensor(rewards).std().item() == pytest.approx(std)
    assert group_advantages(rewards, std_normalize=False) == [0.5, -0.5, 0.0, 0.0]
    assert group_advantages([3.0]) == [0.0] and group_advantages([]) == []
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_a_padded_batch_lays_every_per_token_field_along_the_tokens() -> None:
    a = sample(0, [5, 6], [7, 8, 9], 1.0)
    b = sample(1, [5], [4], 0.0, status=SampleStatus.TRUNCATED)
    b.loss_mask = [0]
    b.rollout_log_probs = [0.0]
    failed = sample(2, [5], [], None, status=SampleStatus.FAILED)
    batch = training_batch([[a, b, failed]], pad_token_id=-1)
    assert not batch.packed
    assert batch.tokens.tolist() == [[5, 6, 7, 8, 9], [5, 4, -1, -1, -1]]
    assert batch.attention_mask.tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch.loss_masks.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]]
    assert batch.rollout_log_probs[0].tolist() == [0.0, 0.0, -0.5, -1.5, -2.5]
    advantage = batch.rewards[0].item()
    assert advantage == pytest.approx(group_advantages([1.0, 0.0])[0])
    assert batch.advantages[0].tolist() == pytest.approx([0, 0, advantage, advantage, advantage])
    assert batch.advantages[1].tolist() == [0.0] * 5  # masked out
    assert batch.raw_reward.tolist() == [1.0, 0.0]
    assert batch.response_lengths.tolist() == [3, 1] and batch.total_lengths.tolist() == [5, 2]
    assert batch.truncated.tolist() == [0, 1] and batch.sample_indices.tolist() == [0, 1]
    assert batch.position_ids.tolist() == [list(range(5))] * 2
    assert batch.rollout_log_probs.dtype == torch.float32


def test_a_packed_batch_is_one_row_with_sequence_bounds() -> None:
    groups = [
        [sample(0, [1], [2, 3], 1.0), sample(1, [1], [4], 0.0)],
        [sample(10, [9, 9], [8], 2.0)],
    ]
    batch = training_batch(groups, pack=True, dtype=torch.float64)
    assert batch.packed and batch.tokens.tolist() == [[1, 2, 3, 1, 4, 9, 9, 8]]
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 8]  # type: ignore[union-attr]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch.loss_masks.tolist() == [[0, 1, 1, 0, 1, 0, 0, 1]]
    # A group of one teaches nothing: its advantage is 0.
    assert batch.rewards.tolist()[2] == 0.0 and batch.rollout_log_probs.dtype == torch.float64


def test_a_sample_without_a_reward_or_any_sample_at_all_is_refused() -> None:
    with pytest.raises(RewardError, match=r"sample 1 .* has reward None"):
        training_batch([[sample(0, [1], [2], 1.0), sample(1, [1], [2], None)]])
    with pytest.raises(RewardError, match="reward_key 'acc'"):
        training_batch([[sample(0, [1], [2], {"f1": 1.0})]], reward_key="acc")  # type: ignore[arg-type]
    failed = sample(
        0, [1], [2], None, status=SampleStatus.FAILED, error=EngineStatusError("x", status=400)
    )
    with pytest.raises(ValueError, match="no sample to train on"):
        training_batch([[failed]])
