"""Generate functions and their contract.

- diffusion: :func:`generate_diffusion` (one microgroup, one ``/rollout/generate``);
- text over ``/generate``: :mod:`~miles_lite.generate.single_turn`,
  :mod:`~miles_lite.generate.multi_turn` (tool calling),
  :mod:`~miles_lite.generate.benchmark` (random output lengths); the helpers custom
  generate functions need are in :mod:`~miles_lite.generate.text_request`.
"""

from miles_lite.generate.contract import (
    GenerateFn,
    GenerateFnInput,
    GenerateFnOutput,
    load_function,
)
from miles_lite.generate.diffusion import (
    DiffusionState,
    apply_response_item,
    build_request,
    generate_diffusion,
)
from miles_lite.generate.text_request import (
    append_env_tokens,
    apply_generate_answer,
    build_generate_payload,
    check_text_sample,
    image_data_urls,
    new_rid,
    post_generate,
    prompt_ids,
    sample_prompt_ids,
    status_of,
)
from miles_lite.generate.text_state import InFlightRequests, TextState
from miles_lite.generate.tool_calls import (
    TOOL_CALL_PARSERS,
    ToolCall,
    ToolCallError,
    ToolCallParser,
    parse_qwen_tool_calls,
)

__all__ = [
    "TOOL_CALL_PARSERS",
    "DiffusionState",
    "GenerateFn",
    "GenerateFnInput",
    "GenerateFnOutput",
    "InFlightRequests",
    "TextState",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "append_env_tokens",
    "apply_generate_answer",
    "apply_response_item",
    "build_generate_payload",
    "build_request",
    "check_text_sample",
    "generate_diffusion",
    "image_data_urls",
    "load_function",
    "new_rid",
    "parse_qwen_tool_calls",
    "post_generate",
    "prompt_ids",
    "sample_prompt_ids",
    "status_of",
]
