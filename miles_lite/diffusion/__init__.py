"""Diffusion rollouts over SGLang-diffusion: the rollout, its config and sampling params,
its context, and the default generate function."""

from miles_lite.diffusion.config import (
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    TransportMode,
)
from miles_lite.diffusion.context import DiffusionContext
from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.diffusion.rollout import DiffusionRollout

__all__ = [
    "DiffusionContext",
    "DiffusionRollout",
    "DiffusionRolloutConfig",
    "DiffusionSamplingParams",
    "TransportMode",
    "generate_diffusion",
]
