"""Rollouts: the generic driver and its users (diffusion, text), filters, seeds, results."""

from miles_lite.pipeline.diffusion_rollout import DiffusionRollout
from miles_lite.pipeline.driver import Driver, RolloutKind
from miles_lite.pipeline.filters import (
    FilterResult,
    GroupFilter,
    drop_aborted,
    drop_failed,
    drop_zero_std,
)
from miles_lite.pipeline.groups import PromptGroup
from miles_lite.pipeline.result import RolloutResult
from miles_lite.pipeline.seeds import group_seeds
from miles_lite.pipeline.text_rollout import AbortContext, TextRollout

__all__ = [
    "AbortContext",
    "DiffusionRollout",
    "Driver",
    "FilterResult",
    "GroupFilter",
    "PromptGroup",
    "RolloutKind",
    "RolloutResult",
    "TextRollout",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "group_seeds",
]
