"""miles_lite: the rollout layer of RL post-training, as a plain Ray-free Python library."""

from miles_lite._core.run_sync import run_sync
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.agentic.server import SessionServer, SessionServerConfig
from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.router import Router
from miles_lite.errors import (
    AgentError,
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
    SampleInvariantError,
    SamplingParamsError,
    SessionError,
    ToolError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
    WorkerTimeoutError,
)
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool
from miles_lite.pools.worker_pool import WorkerPool
from miles_lite.rollout.config import (
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    TextRolloutConfig,
)
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.rollout.filters import FilterResult, drop_aborted, drop_failed, drop_zero_std
from miles_lite.rollout.groups import PromptGroup
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.sampling import TextSamplingParams, check_sampling_params
from miles_lite.text.rollout import TextRollout
from miles_lite.types import DiTTrajectory, PrefixCacheInfo, Sample, SampleStatus

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentGenerate",
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
    "PrefixCacheInfo",
    "PromptGroup",
    "RetryPolicy",
    "RewardError",
    "RewardPool",
    "RolloutResult",
    "Router",
    "RouterConfig",
    "Sample",
    "SampleInvariantError",
    "SampleStatus",
    "SamplingParamsError",
    "SessionError",
    "SessionServer",
    "SessionServerConfig",
    "TextRollout",
    "TextRolloutConfig",
    "TextSamplingParams",
    "ToolError",
    "UnitSpan",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerPool",
    "WorkerTaskError",
    "WorkerTimeoutError",
    "check_sampling_params",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "generate_diffusion",
    "run_sync",
]
