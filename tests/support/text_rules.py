"""The scripted answers the text and agentic suites share (one copy, issue 34.7)."""

from __future__ import annotations

from miles_lite.testing import TextRule

#: The tool round trip: "add N and M" answers a call of the ``add`` tool; once the tool's
#: answer is in the prompt, a boxed sum.
TOOL_RULES = (
    TextRule(r"<tool_response>", "The sum is \\boxed{5}."),
    TextRule(
        r"add \d+ and \d+",
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    ),
)
