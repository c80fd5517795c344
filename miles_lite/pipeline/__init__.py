"""Rollout drivers: microgroup tasks, groups, metrics."""

from miles_lite.pipeline.diffusion_rollout import (
    DiffusionRollout,
    GroupFilter,
    PromptGroup,
    RolloutResult,
)
from miles_lite.pipeline.spans import MicrogroupSpan

__all__ = ["DiffusionRollout", "GroupFilter", "MicrogroupSpan", "PromptGroup", "RolloutResult"]
