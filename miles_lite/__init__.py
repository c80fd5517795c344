"""miles_lite: the rollout layer of RL post-training, as a plain Ray-free Python library."""

from miles_lite.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.engine import EngineClient, EngineClientConfig, RetryPolicy, Router, RouterConfig
from miles_lite.errors import (
    ArenaError,
    ArenaFullError,
    BodyTooLargeError,
    ClosedResourceError,
    CodecError,
    ConfigError,
    EngineError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    FilterError,
    GenerateError,
    MilesLiteError,
    RewardError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
)
from miles_lite.generate import GenerateFnInput, generate_diffusion
from miles_lite.pipeline import (
    DiffusionRollout,
    FilterResult,
    PromptGroup,
    RolloutResult,
    drop_aborted,
    drop_failed,
    drop_zero_std,
)
from miles_lite.pools import (
    ApiRewardPool,
    ArenaConfig,
    ParserPool,
    ParserPoolConfig,
    RewardPool,
    WorkerPool,
)
from miles_lite.run_sync import run_sync
from miles_lite.spans import UnitSpan
from miles_lite.types import DiTTrajectory, Sample, SampleStatus

__version__ = "0.1.0"

__all__ = [
    "ApiRewardPool",
    "ArenaConfig",
    "ArenaError",
    "ArenaFullError",
    "BodyTooLargeError",
    "ClosedResourceError",
    "CodecError",
    "ConfigError",
    "DiTTrajectory",
    "DiffusionRollout",
    "DiffusionRolloutConfig",
    "DiffusionSamplingParams",
    "EngineClient",
    "EngineClientConfig",
    "EngineError",
    "EngineProtocolError",
    "EngineStatusError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "FilterError",
    "FilterResult",
    "GenerateError",
    "GenerateFnInput",
    "MilesLiteError",
    "ParserPool",
    "ParserPoolConfig",
    "PromptGroup",
    "RetryPolicy",
    "RewardError",
    "RewardPool",
    "RolloutResult",
    "Router",
    "RouterConfig",
    "Sample",
    "SampleStatus",
    "UnitSpan",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerPool",
    "WorkerTaskError",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "generate_diffusion",
    "run_sync",
]
