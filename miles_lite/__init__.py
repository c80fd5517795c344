"""miles_lite: the rollout layer of RL post-training, as a plain Ray-free Python library.

The names a rollout needs are here; the parts live in their packages
(:mod:`miles_lite.text`, :mod:`miles_lite.diffusion`, :mod:`miles_lite.agentic`,
:mod:`miles_lite.engine`, :mod:`miles_lite.pools`, :mod:`miles_lite.rewards`), and the
whole error tree in :mod:`miles_lite.errors`.

The names load on first use (PEP 562): ``import miles_lite`` alone imports nothing heavy,
so ``miles-lite --help`` answers at once; ``from miles_lite import TextRollout`` imports
what the text rollout needs (torch, transformers, aiohttp) then.
"""

import importlib
import typing

__version__ = "0.1.0"

__all__ = [
    "AgentGenerate",
    "CodecError",
    "ConfigError",
    "DiffusionRollout",
    "DiffusionRolloutConfig",
    "DiffusionSamplingParams",
    "EngineConfig",
    "EngineError",
    "FilterResult",
    "GenerateError",
    "MilesLiteError",
    "PromptGroup",
    "RewardError",
    "RolloutResult",
    "Sample",
    "SampleStatus",
    "TextRollout",
    "TextRolloutConfig",
    "TextSamplingParams",
    "WorkerError",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "run_sync",
]

#: Where each public name is defined.
_WHERE = {
    "AgentGenerate": "miles_lite.agentic.agent",
    "CodecError": "miles_lite.errors",
    "ConfigError": "miles_lite.errors",
    "DiffusionRollout": "miles_lite.diffusion.rollout",
    "DiffusionRolloutConfig": "miles_lite.diffusion.config",
    "DiffusionSamplingParams": "miles_lite.diffusion.config",
    "EngineConfig": "miles_lite.engine.config",
    "EngineError": "miles_lite.errors",
    "FilterResult": "miles_lite.rollout.filters",
    "GenerateError": "miles_lite.errors",
    "MilesLiteError": "miles_lite.errors",
    "PromptGroup": "miles_lite.rollout.groups",
    "RewardError": "miles_lite.errors",
    "RolloutResult": "miles_lite.rollout.result",
    "Sample": "miles_lite.types",
    "SampleStatus": "miles_lite.types",
    "TextRollout": "miles_lite.text.rollout",
    "TextRolloutConfig": "miles_lite.text.config",
    "TextSamplingParams": "miles_lite.sglang.sampling",
    "WorkerError": "miles_lite.errors",
    "drop_aborted": "miles_lite.rollout.filters",
    "drop_failed": "miles_lite.rollout.filters",
    "drop_zero_std": "miles_lite.rollout.filters",
    "run_sync": "miles_lite._core.run_sync",
}

if typing.TYPE_CHECKING:
    from miles_lite._core.run_sync import run_sync
    from miles_lite.agentic.agent import AgentGenerate
    from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
    from miles_lite.diffusion.rollout import DiffusionRollout
    from miles_lite.engine.config import EngineConfig
    from miles_lite.errors import (
        CodecError,
        ConfigError,
        EngineError,
        GenerateError,
        MilesLiteError,
        RewardError,
        WorkerError,
    )
    from miles_lite.rollout.filters import FilterResult, drop_aborted, drop_failed, drop_zero_std
    from miles_lite.rollout.groups import PromptGroup
    from miles_lite.rollout.result import RolloutResult
    from miles_lite.sglang.sampling import TextSamplingParams
    from miles_lite.text.config import TextRolloutConfig
    from miles_lite.text.rollout import TextRollout
    from miles_lite.types import Sample, SampleStatus


def __getattr__(name: str) -> typing.Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'miles_lite' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
