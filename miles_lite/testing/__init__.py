"""Stand-in SGLang engines speaking the real wire format, for tests, benchmarks and demos.

- :class:`TextStandInEngine`: ``/generate`` and the control endpoints over the real Qwen3
  tokenizer (:func:`load_qwen3_tokenizer`), a scripted :class:`TextPolicy`; also
  ``/v1/chat/completions``. :class:`TextEngineProcess` / :class:`TextEngineProcessGroup`
  run it in child processes; :class:`TinyModelPolicy` makes it answer with a tiny
  random-weight Qwen2 model instead of the script. :func:`shape_diff` compares two
  answers (or an answer and a capture) key by key.
- :class:`SGLangServer`: a real SGLang 0.5.23 server on this CPU, in the venv
  ``scripts/sglang-cpu/setup.sh`` builds (the conformance tier).
- :class:`SmgRouter`: SGLang's router (``smg``, ``pip install smg``) in front of running
  engines, launched with the flags miles_lite needs (the smg tier).
- :class:`StandInEngine`: a diffusion engine, an aiohttp server on loopback (``async with``), configured by
  :class:`StandInConfig`, with runtime :class:`Faults` and :class:`EngineStats`.
- :class:`EngineProcess` / :class:`EngineProcessGroup`: the same in child processes.
- :func:`synthetic_sample` / :func:`synthetic_body`: the deterministic samples it sends,
  for tests that recompute what an answer must hold.

Every stand-in gives a frozen snapshot of what it has seen with ``statistics()``
(:class:`TextEngineStatistics`, :class:`EngineStatistics`). The stand-ins are an oracle
for the library and share none of its code: a bad stand-in configuration raises
:class:`ValueError` (naming the field and the value); a harness that fails (a child
process that does not start, a closed engine started again) raises :class:`StandInError`.
:class:`ChildProcess` / :class:`ProcessGroup` run any stand-in (an engine factory and its
config) in child processes; the process classes above are thin specialisations of them.
"""

from __future__ import annotations

from miles_lite.testing.diffusion.body import synthetic_body
from miles_lite.testing.diffusion.config import OPTIONAL_GROUPS, StandInConfig
from miles_lite.testing.diffusion.encode import (
    encode_json_body,
    encode_msgpack_body,
    encode_msgpack_pieces,
    encode_tensor_map,
)
from miles_lite.testing.diffusion.engine import StandInEngine
from miles_lite.testing.diffusion.faults import Faults
from miles_lite.testing.diffusion.process import EngineProcess, EngineProcessGroup
from miles_lite.testing.diffusion.request import SDE_TYPES, InvalidRequestError, RolloutRequest
from miles_lite.testing.diffusion.stats import EngineStatistics, EngineStats
from miles_lite.testing.diffusion.trajectories import sigma_schedule, synthetic_sample
from miles_lite.testing.errors import StandInError
from miles_lite.testing.process import ChildProcess, ProcessGroup
from miles_lite.testing.sglang_server import SGLangServer, SGLangServerConfig, default_sglang_venv
from miles_lite.testing.smg_router import SmgRouter
from miles_lite.testing.text.config import SGLANG_VERSION, TextStandInConfig
from miles_lite.testing.text.engine import TextStandInEngine
from miles_lite.testing.text.model import TinyModelPolicy
from miles_lite.testing.text.policy import TextPolicy, TextRule, token_logprob
from miles_lite.testing.text.process import TextEngineProcess, TextEngineProcessGroup
from miles_lite.testing.text.shapes import shape_diff, wire_shape
from miles_lite.testing.text.stats import TextEngineStatistics, TextEngineStats
from miles_lite.testing.text.tools import ADD_TOOLS
from miles_lite.testing.text.validate import SAMPLING_KEYS
from miles_lite.testing.tokenizers import load_qwen3_tokenizer, qwen3_tokenizer_dir

__all__ = [
    "ADD_TOOLS",
    "OPTIONAL_GROUPS",
    "SAMPLING_KEYS",
    "SDE_TYPES",
    "SGLANG_VERSION",
    "ChildProcess",
    "EngineProcess",
    "EngineProcessGroup",
    "EngineStatistics",
    "EngineStats",
    "Faults",
    "InvalidRequestError",
    "ProcessGroup",
    "RolloutRequest",
    "SGLangServer",
    "SGLangServerConfig",
    "SmgRouter",
    "StandInConfig",
    "StandInEngine",
    "StandInError",
    "TextEngineProcess",
    "TextEngineProcessGroup",
    "TextEngineStatistics",
    "TextEngineStats",
    "TextPolicy",
    "TextRule",
    "TextStandInConfig",
    "TextStandInEngine",
    "TinyModelPolicy",
    "default_sglang_venv",
    "encode_json_body",
    "encode_msgpack_body",
    "encode_msgpack_pieces",
    "encode_tensor_map",
    "load_qwen3_tokenizer",
    "qwen3_tokenizer_dir",
    "shape_diff",
    "sigma_schedule",
    "synthetic_body",
    "synthetic_sample",
    "token_logprob",
    "wire_shape",
]
