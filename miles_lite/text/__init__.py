"""Text rollouts over SGLang: the rollout, its config and context, and the generate
functions with the helpers a custom one needs: ``single_turn.generate`` (the default),
:class:`MultiTurn` (tool calling), :class:`Benchmark` (random output lengths)."""

from miles_lite.text.benchmark import Benchmark
from miles_lite.text.config import TextRolloutConfig
from miles_lite.text.context import TextContext
from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
from miles_lite.text.request import append_env_tokens, apply_answer, post_generate
from miles_lite.text.rollout import TextRollout
from miles_lite.text.tokenize import prompt_ids, sample_prompt_ids
from miles_lite.text.tool_calls import TOOL_CALL_PARSERS, ToolCall, ToolCallError

__all__ = [
    "TOOL_CALL_PARSERS",
    "Benchmark",
    "MultiTurn",
    "MultiTurnOptions",
    "TextContext",
    "TextRollout",
    "TextRolloutConfig",
    "ToolCall",
    "ToolCallError",
    "append_env_tokens",
    "apply_answer",
    "post_generate",
    "prompt_ids",
    "sample_prompt_ids",
]
