"""miles_lite: the rollout layer of RL post-training, as a plain Ray-free Python library."""

from miles_lite.errors import (
    ArenaError,
    BodyTooLargeError,
    ClosedResourceError,
    CodecError,
    ConfigError,
    EngineError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
    RewardError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
)
from miles_lite.types import DiTTrajectory, Sample, SampleStatus

__version__ = "0.1.0"

__all__ = [
    "ArenaError",
    "BodyTooLargeError",
    "ClosedResourceError",
    "CodecError",
    "ConfigError",
    "DiTTrajectory",
    "EngineError",
    "EngineProtocolError",
    "EngineStatusError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "MilesLiteError",
    "RewardError",
    "Sample",
    "SampleStatus",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTaskError",
]
