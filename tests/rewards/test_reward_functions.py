"""The small reward functions, and the package's exported names."""

from __future__ import annotations

import pickle

import pytest
import torch

from miles_lite.errors import ConfigError, RewardError
from miles_lite.rewards.functions import (
    ConstantReward,
    constant_reward,
    latent_mean_reward,
    response_length_reward,
)
from miles_lite.types import Sample


def test_latent_mean_reward_is_the_mean_of_generated_output() -> None:
    samples = [
        Sample(index=0, generated_output=torch.full((4, 8, 8), 0.25)),
        Sample(index=1, generated_output=torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)),
    ]
    assert latent_mean_reward(samples) == [0.25, 2.0]
    assert pickle.loads(pickle.dumps(latent_mean_reward)) is latent_mean_reward


def test_latent_mean_reward_names_a_sample_without_output() -> None:
    with pytest.raises(RewardError, match="sample 3"):
        latent_mean_reward([Sample(index=3)])


def test_constant_reward_pickles_and_scores_every_sample() -> None:
    reward = pickle.loads(pickle.dumps(constant_reward(0.5)))
    assert reward == ConstantReward(0.5)
    assert reward([Sample(), Sample()]) == [0.5, 0.5]
    with pytest.raises(ConfigError, match="finite number"):
        constant_reward(float("nan"))


def test_response_length_reward() -> None:
    assert response_length_reward([Sample(response_length=7), Sample()]) == [7.0, 0.0]
