"""miles_lite: the rollout layer of RL post-training, as a plain Ray-free Python library.

The names a rollout needs are here; the parts live in their packages
(:mod:`miles_lite.text`, :mod:`miles_lite.diffusion`, :mod:`miles_lite.agentic`,
:mod:`miles_lite.engine`, :mod:`miles_lite.pools`, :mod:`miles_lite.rewards`), and the
whole error tree in :mod:`miles_lite.errors`.

The names load on first use (PEP 562): ``import miles_lite`` alone imports nothing heavy,
so ``miles-lite --help`` answers at once; ``from miles_lite import TextRollout`` imports
what the text rollout needs (torch, transformers, aiohttp) then.
"""

from miles_lite._core.lazy import lazy_exports as _lazy_exports
from miles_lite._core.notebook import quiet_tqdm_auto as _quiet_tqdm_auto

_quiet_tqdm_auto()  # before transformers imports tqdm.auto (it warns once, in a kernel)

# Imported when first used: a worker process that imports one light module of the
# package (a parser worker: codecs, page table, HTTP) must not import torch with it.
_EXPORTS: dict[str, list[str]] = {
    "miles_lite._core.run_sync": ["run_sync"],
    "miles_lite.errors": [
        "CodecError",
        "ConfigError",
        "EngineError",
        "GenerateError",
        "MilesLiteError",
        "RewardError",
        "WorkerError",
    ],
    "miles_lite.agentic.agent": ["AgentGenerate"],
    "miles_lite.diffusion.config": ["DiffusionRolloutConfig", "DiffusionSamplingParams"],
    "miles_lite.diffusion.rollout": ["DiffusionRollout"],
    "miles_lite.engine.config": ["EngineConfig"],
    "miles_lite.rollout.filters": [
        "FilterResult",
        "drop_aborted",
        "drop_failed",
        "drop_zero_std",
    ],
    "miles_lite.rollout.groups": ["PromptGroup"],
    "miles_lite.rollout.result": ["RolloutResult"],
    "miles_lite.sglang.sampling": ["TextSamplingParams"],
    "miles_lite.text.config": ["TextRolloutConfig"],
    "miles_lite.text.rollout": ["TextRollout"],
    "miles_lite.types": ["Sample", "SampleStatus"],
}
__getattr__, __dir__, __all__ = _lazy_exports(__name__, _EXPORTS)

__version__ = "0.1.0"
