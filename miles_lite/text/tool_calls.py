"""Tool calls in model output: the Qwen/Hermes ``<tool_call>{json}</tool_call>`` format.

A parser is ``(text) -> list[ToolCall | ToolCallError]``: each call the model wrote, or
what was wrong with it (malformed or too deeply nested JSON, no name), so the model can be
told. Other formats plug in as any callable of that shape.

It runs on the event loop, on whatever a policy writes, degenerate outputs included (a
turn repeating ``<tool_call> {`` thousands of times): parsing is one linear scan, and at
most :data:`MAX_CALLS` calls are read per turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_CALLS",
    "TOOL_CALL_PARSERS",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "parse_qwen_tool_calls",
]

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"

#: Calls read from one turn; more are answered with one ToolCallError.
MAX_CALLS = 64


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
    Linear in ``len(text)``: each call is the text between an opening tag and the next
    closing one (as a lazy regex reads it); an opening tag never closed ends the scan.
    """
    calls: list[ToolCall | ToolCallError] = []
    for raw in _bodies(text):
        if len(calls) == MAX_CALLS:
            calls.append(
                ToolCallError(
                    raw, f"more than {MAX_CALLS} tool calls in one turn; the rest were not run"
                )
            )
            break
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            reason = (
                "tool call JSON nested too deeply"
                if isinstance(exc, RecursionError)
                else f"malformed tool call JSON: {exc}"
            )
            calls.append(ToolCallError(raw[:200], reason))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ToolCallError(raw, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as exc:
                calls.append(
                    ToolCallError(raw[:200], f"malformed tool call arguments: {exc!r:.200}")
                )
                continue
        if not isinstance(arguments, dict):
            calls.append(ToolCallError(raw, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], arguments))
    return calls


def _bodies(text: str) -> list[str]:
    """The stripped text between each ``<tool_call>`` and the next ``</tool_call>``."""
    bodies: list[str] = []
    at = 0
    while True:
        start = text.find(_OPEN, at)
        if start < 0:
            return bodies
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            return bodies  # never closed: no later opening tag is closed either
        bodies.append(text[start + len(_OPEN) : end].strip())
        at = end + len(_CLOSE)


#: Parsers by the names ``--generate-tool-call-parser`` takes.
TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "qwen": parse_qwen_tool_calls,
    "qwen25": parse_qwen_tool_calls,
    "hermes": parse_qwen_tool_calls,
}
