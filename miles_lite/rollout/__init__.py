"""The rollout machinery every kind shares: the driver and its per-run context, the
generate-function contract, groups, seeds, filters, rewards, results and spans."""

from miles_lite.rollout.config import RolloutConfig
from miles_lite.rollout.context import InFlight, RunContext
from miles_lite.rollout.contract import AbortResult, BindsContext, GenerateFn, GenerateFnInput
from miles_lite.rollout.driver import Driver, RolloutKind
from miles_lite.rollout.filters import (
    FilterResult,
    GroupFilter,
    drop_aborted,
    drop_failed,
    drop_zero_std,
)
from miles_lite.rollout.groups import PromptGroup
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.rollout import Rollout
from miles_lite.rollout.seeds import group_seeds
from miles_lite.rollout.spans import UnitSpan

__all__ = [
    "AbortResult",
    "BindsContext",
    "Driver",
    "FilterResult",
    "GenerateFn",
    "GenerateFnInput",
    "GroupFilter",
    "InFlight",
    "PromptGroup",
    "Rollout",
    "RolloutConfig",
    "RolloutKind",
    "RolloutResult",
    "RunContext",
    "UnitSpan",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "group_seeds",
]
