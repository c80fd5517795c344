"""Small picklable reward functions for demos and tests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from miles_lite.errors import ConfigError, RewardError

if TYPE_CHECKING:
    from miles_lite.types import Sample

__all__ = ["ConstantReward", "constant_reward", "latent_mean_reward", "response_length_reward"]


def latent_mean_reward(samples: list[Sample]) -> list[float]:
    """The mean value of each sample's ``generated_output`` (any shape, any float dtype).

    A cheap stand-in for an image reward, useful with the stand-in engine's latents.
    Raises ``RewardError`` naming the sample index if ``generated_output`` is missing or
    empty.
    """
    import torch

    scores: list[float] = []
    for s in samples:
        out = s.generated_output
        if not isinstance(out, torch.Tensor) or out.numel() == 0:
            raise RewardError(
                f"latent_mean_reward: sample {s.index} has no generated_output tensor"
            )
        scores.append(float(out.float().mean()))
    return scores


def response_length_reward(samples: list[Sample]) -> list[float]:
    """Each sample's ``response_length`` (tokens) as a float: a stand-in text reward."""
    return [float(s.response_length) for s in samples]


@dataclass(frozen=True, slots=True)
class ConstantReward:
    """A reward function that gives every sample ``value``; picklable.

    Usage: ``ConstantReward(1.0)(samples) == [1.0] * len(samples)``.
    """

    value: float

    def __post_init__(self) -> None:
        """Raises ``ConfigError`` if ``value`` is not a finite number."""
        if (
            isinstance(self.value, bool)
            or not isinstance(self.value, (int, float))
            or not math.isfinite(self.value)
        ):
            raise ConfigError(f"ConstantReward value must be a finite number, got {self.value!r}")

    def __call__(self, samples: list[Sample]) -> list[float]:
        """``[value] * len(samples)``."""
        return [float(self.value)] * len(samples)


def constant_reward(value: float) -> ConstantReward:
    """A picklable reward function scoring every sample ``value`` (see :class:`ConstantReward`)."""
    return ConstantReward(value)
