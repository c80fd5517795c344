"""A stand-in SGLang diffusion engine speaking the real wire format, for tests and benchmarks.

- :class:`StandInEngine`: an aiohttp server on loopback (``async with``), configured by
  :class:`StandInConfig`, with runtime :class:`Faults` and :class:`EngineStats`.
- :class:`EngineProcess` / :class:`EngineProcessGroup`: the same in child processes.
- :func:`synthetic_sample` / :func:`synthetic_body`: the deterministic samples it sends,
  for tests that recompute what an answer must hold.
"""

from __future__ import annotations

from miles_lite.testing.engine import StandInEngine
from miles_lite.testing.engine_config import OPTIONAL_GROUPS, StandInConfig
from miles_lite.testing.engine_stats import EngineStats
from miles_lite.testing.faults import Faults
from miles_lite.testing.process import EngineProcess, EngineProcessGroup
from miles_lite.testing.rollout_body import synthetic_body
from miles_lite.testing.rollout_request import SDE_TYPES, InvalidRequestError, RolloutRequest
from miles_lite.testing.trajectories import sigma_schedule, synthetic_sample

__all__ = [
    "OPTIONAL_GROUPS",
    "SDE_TYPES",
    "EngineProcess",
    "EngineProcessGroup",
    "EngineStats",
    "Faults",
    "InvalidRequestError",
    "RolloutRequest",
    "StandInConfig",
    "StandInEngine",
    "sigma_schedule",
    "synthetic_body",
    "synthetic_sample",
]
