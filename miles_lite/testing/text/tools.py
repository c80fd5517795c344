"""The ``add`` tool of the stand-in's tool-calling scripts, as an OpenAI tool spec."""

from __future__ import annotations

from typing import Any

__all__ = ["ADD_TOOLS"]

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
