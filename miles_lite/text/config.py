"""Configuration of text rollouts: a frozen keyword-only dataclass, checked on creation."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from miles_lite._core.validate import check_int, check_type
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.errors import ConfigError
from miles_lite.rollout.config import RolloutConfig
from miles_lite.sglang.sampling import TextSamplingParams

__all__ = ["TextRolloutConfig"]


def _default_engines() -> EngineConfig:
    # Text engines batch hundreds of requests (miles' default concurrency is 512 per
    # engine group); SGLang's --max-running-requests is about this.
    return EngineConfig(router=RouterConfig(max_inflight_per_engine=256))


def _default_tokenize_threads() -> int:
    # Measured on 2 busy cores (benchmarks/tokenize_loop_lag.py, 8 prompts of 79k
    # tokens): 1 thread kept the loop's worst wake-up at ~25 ms, 2 at ~40 ms, 8 at
    # ~150 ms, for the same wall time: the Rust tokenizer already uses the spare cores.
    return max(1, min(4, (os.cpu_count() or 1) // 4))


@dataclass(frozen=True, kw_only=True)
class TextRolloutConfig(RolloutConfig):
    """How a text rollout runs (and :class:`RolloutConfig`'s shared settings).

    - ``sampling``: default sampling parameters (each generate call gets a copy);
    - ``engines``: the client's limits and the router's in-flight bound (default: 256
      requests per engine);
    - ``max_context_len``: the engines' context (prompt + output); a prompt leaving no
      room is never sent (the sample ends TRUNCATED); ``None``: unknown;
    - ``tokenize_threads``: worker threads for tokenizing and chat templating (default:
      a quarter of the cores, 1 to 4);
    - ``reward_key``: the entry of a dict reward that filters and metrics read;
    - ``abort_all_on_stop``: on early stop, abort everything on the engines
      (``abort_all``, as miles and slime do) when this run is the rollout's only one;
      ``False`` when the engines also serve other work: then each of the run's rids is
      aborted at the engine that holds it.

    Usage: ``TextRolloutConfig(n_samples_per_prompt=8, rollout_batch_size=32)``.
    """

    sampling: TextSamplingParams = field(default_factory=TextSamplingParams)
    engines: EngineConfig = field(default_factory=_default_engines)
    max_context_len: int | None = None
    tokenize_threads: int = field(default_factory=_default_tokenize_threads)
    reward_key: str | None = None
    abort_all_on_stop: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "TextRolloutConfig"
        check_type(owner, "sampling", self.sampling, TextSamplingParams)
        check_type(owner, "engines", self.engines, EngineConfig)
        check_int(owner, "max_context_len", self.max_context_len, optional=True)
        check_int(owner, "tokenize_threads", self.tokenize_threads)
        if self.reward_key is not None and not isinstance(self.reward_key, str):
            raise ConfigError(f"{owner}.reward_key must be a str or None, got {self.reward_key!r}")
