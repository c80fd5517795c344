"""Kept groups into training tensors, with miles' field names and GRPO's group-normalized
advantages (pure)."""

from __future__ import annotations

import math

import pytest
import torch

from miles_lite.errors import EngineStatusError, RewardError
from miles_lite.training.batch import group_advantages, training_batch, trains_on
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


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_refused_naming_the_sample(bad: float) -> None:
    group = [sample(0, [1], [2], 1.0), sample(1, [1], [3], bad, request_id="rid-1")]
    with pytest.raises(RewardError, match=rf"sample 1 \(group 0\) has reward {bad!r}, not finite"):
        training_batch([group])
    # The same for the entry a dict reward is read from.
    scored = [sample(0, [1], [2], {"acc": 1.0}), sample(1, [1], [3], {"acc": bad})]  # type: ignore[arg-type]
    with pytest.raises(RewardError, match=r"sample 1 .* not finite under reward_key 'acc'") as info:
        training_batch([scored], reward_key="acc")
    assert info.value.request_id is None
    with pytest.raises(RewardError) as named:
        training_batch([group])
    assert named.value.request_id == "rid-1"


def test_a_bool_reward_is_still_refused_as_not_a_number() -> None:
    with pytest.raises(RewardError, match=r"sample 1 .* has reward True, not a number"):
        training_batch([[sample(0, [1], [2], 1.0), sample(1, [1], [3], True)]])  # type: ignore[arg-type]


def test_a_batch_trains_on_answers_and_normalizes_each_group_over_exactly_those() -> None:
    right = sample(0, [1], [2, 3], 1.0)
    wrong = sample(1, [1], [4], 0.0, status=SampleStatus.TRUNCATED)
    partial = sample(2, [1], [5], 1.0, status=SampleStatus.ABORTED)  # kept, with output
    # Nothing of these reaches the batch, nor their group's mean and std, even with a reward.
    pending = sample(3, [1], [], 0.0, status=SampleStatus.PENDING)
    empty = sample(4, [1], [], 0.0, status=SampleStatus.ABORTED)
    failed = sample(5, [1], [6], 0.0, status=SampleStatus.FAILED)
    group = [right, wrong, partial, pending, empty, failed]
    assert [trains_on(s) for s in group] == [True, True, True, False, False, False]
    batch = training_batch([group])
    assert batch.sample_indices.tolist() == [0, 1, 2]
    assert batch.raw_reward.tolist() == [1.0, 0.0, 1.0]
    assert batch.rewards.tolist() == pytest.approx(group_advantages([1.0, 0.0, 1.0]))
    # A group whose only answer is a lone sample beside a PENDING one teaches nothing.
    alone = training_batch([[sample(0, [1], [2], 1.0), pending]])
    assert alone.sample_indices.tolist() == [0] and alone.rewards.tolist() == [0.0]
    with pytest.raises(ValueError, match="PENDING or ABORTED without a token"):
        training_batch([[pending, empty]])
