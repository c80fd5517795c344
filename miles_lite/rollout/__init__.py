"""The rollout machinery every kind shares: the driver and its per-run context, the
generate-function contract, groups, seeds, filters, rewards, results and spans; and what
a trainer embeds: weight updates, streamed groups, the staleness bound, training batches."""

from miles_lite.rollout.batch import TrainingBatch, group_advantages, training_batch
from miles_lite.rollout.config import RolloutConfig
from miles_lite.rollout.context import InFlight, RunContext
from miles_lite.rollout.contract import AbortResult, BindsContext, GenerateFn, GenerateFnInput
from miles_lite.rollout.driver import Driver
from miles_lite.rollout.filters import (
    FilterResult,
    GroupFilter,
    drop_aborted,
    drop_failed,
    drop_zero_std,
)
from miles_lite.rollout.groups import PromptGroup
from miles_lite.rollout.hooks import RunHandle, RunHooks
from miles_lite.rollout.kind import RolloutKind
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.rollout import Rollout
from miles_lite.rollout.seeds import group_seeds
from miles_lite.rollout.spans import UnitSpan
from miles_lite.rollout.staleness import StalenessPolicy, group_lag, staleness_metrics
from miles_lite.rollout.stream import GroupStream, StreamStatistics
from miles_lite.rollout.weights import WeightUpdateConfig, WeightUpdateReport, update_weights

__all__ = [
    "AbortResult",
    "BindsContext",
    "Driver",
    "FilterResult",
    "GenerateFn",
    "GenerateFnInput",
    "GroupFilter",
    "GroupStream",
    "InFlight",
    "PromptGroup",
    "Rollout",
    "RolloutConfig",
    "RolloutKind",
    "RolloutResult",
    "RunContext",
    "RunHandle",
    "RunHooks",
    "StalenessPolicy",
    "StreamStatistics",
    "TrainingBatch",
    "UnitSpan",
    "WeightUpdateConfig",
    "WeightUpdateReport",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "group_advantages",
    "group_lag",
    "group_seeds",
    "staleness_metrics",
    "training_batch",
    "update_weights",
]
