"""What SGLang's HTTP surface means, as pure functions with no I/O: the sampling keys and
their chat names, ``/generate`` payloads and the one parser of its answers, chat answers
into turn records, ``/rollout/generate`` requests and items, the control endpoints.

:mod:`miles_lite.engine` sends the bytes; the rollout kinds build on these shapes.
"""

from miles_lite.sglang.chat_wire import TurnRecord, record_from_choice
from miles_lite.sglang.control import PauseMode
from miles_lite.sglang.generate_wire import (
    GenerateAnswer,
    build_generate_payload,
    new_rid,
    parse_generate_answer,
    parse_logprob_triples,
)
from miles_lite.sglang.sampling import (
    CHAT_NAMES,
    SAMPLING_KEYS,
    TextSamplingParams,
    chat_request_kwargs,
    check_sampling_params,
)

__all__ = [
    "CHAT_NAMES",
    "SAMPLING_KEYS",
    "GenerateAnswer",
    "PauseMode",
    "TextSamplingParams",
    "TurnRecord",
    "build_generate_payload",
    "chat_request_kwargs",
    "check_sampling_params",
    "new_rid",
    "parse_generate_answer",
    "parse_logprob_triples",
    "record_from_choice",
]
