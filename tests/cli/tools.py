"""What the CLI tests point dotted paths at: tool specs (a list, and a function returning
one), a tool, something that is not callable."""

from __future__ import annotations

from typing import Any

from miles_lite.testing import ADD_TOOLS

#: The ``add`` tool the text stand-in's script calls.
TOOLS = ADD_TOOLS

#: Not a function: ``--generate-execute-tool-function-path`` must refuse it.
NOT_CALLABLE = 42


def tool_specs() -> list[dict[str, Any]]:
    """The tool specs, from a function (miles allows either)."""
    return list(ADD_TOOLS)


async def execute_tool(name: str, arguments: dict[str, Any]) -> str:
    """``add(a, b)``."""
    return str(int(arguments["a"]) + int(arguments["b"]))
