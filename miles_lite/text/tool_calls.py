"""Tool calls in model output: the Qwen/Hermes ``<tool_call>{json}</tool_call>`` format.

A parser is ``(text) -> list[ToolCall | ToolCallError]``: each call the model wrote, or
what was wrong with it (malformed JSON, no name), so the model can be told. Other
formats plug in as any callable of that shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TOOL_CALL_PARSERS",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "parse_qwen_tool_calls",
]

_QWEN = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for: the tool's ``name`` and its ``arguments``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """A call the model wrote but that cannot be run: ``raw`` text and why (``reason``)."""

    raw: str
    reason: str


ToolCallParser = Callable[[str], list[ToolCall | ToolCallError]]


def parse_qwen_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` of ``text``.

    ``arguments`` may be an object or a JSON string holding one (some models quote it).
    """
    calls: list[ToolCall | ToolCallError] = []
    for raw in _QWEN.findall(text):
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            calls.append(ToolCallError(raw, f"malformed tool call JSON: {exc}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCallError(raw, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError as exc:
                calls.append(ToolCallError(raw, f"malformed tool call arguments: {exc}"))
                continue
        if not isinstance(arguments, dict):
            calls.append(ToolCallError(raw, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], arguments))
    return calls


#: Parsers by the names ``--generate-tool-call-parser`` takes.
TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "qwen": parse_qwen_tool_calls,
    "qwen25": parse_qwen_tool_calls,
    "hermes": parse_qwen_tool_calls,
}
