"""Tools in the text stand-in: the ``add`` tool spec its scripts call, and tool-call parsing.

:data:`ADD_TOOLS` is the OpenAI tool list the examples and tests give the chat template;
:func:`parse_tool_calls` reads ``<tool_call>{json}</tool_call>`` blocks out of an answer
as SGLang's ``qwen25`` parser does.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["ADD_TOOLS", "parse_tool_calls"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

#: ``[{"type": "function", "function": {"name": "add", ...}}]``: add two integers ``a`` and
#: ``b``; the tool list the examples and tests give the chat template and ``multi_turn``.
ADD_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``(normal text, tool calls)`` of a model answer, as SGLang's qwen25 parser gives
    them; a block whose JSON does not parse stays in the text (SGLang keeps it too)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "index": len(calls),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    kept.append(text[last:])
    return "".join(kept).strip(), calls
