"""check_append_only on the real Qwen3 chat template."""

from __future__ import annotations

from typing import Any

from miles_lite.agentic.template_check import check_append_only

from .conftest import TOOLS

THINK = "<think>\nLet me add.\n</think>\n\nIt is 5."


def test_qwen3_drops_earlier_think_blocks(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": THINK},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "Yes."},
    ]
    report = check_append_only(tokenizer, messages)
    assert not report.append_only and report.checked == 1
    (brk,) = report.breaks
    assert (brk.message_index, brk.next_index) == (1, 3)
    assert brk.rendered.startswith("<think>") and not brk.re_rendered.startswith("<think>")
    assert "message 1" in str(report)


def tool_loop(first_content: str) -> list[dict[str, Any]]:
    call = {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    return [
        {"role": "user", "content": "Please add 2 and 3."},
        {
            "role": "assistant",
            "content": first_content,
            "tool_calls": [{"id": "c1", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "The sum is 5."},
    ]


def test_a_thinking_tool_loop_is_append_only(tokenizer: Any) -> None:
    # Turns after the last user message keep their reasoning: nothing is re-rendered.
    report = check_append_only(tokenizer, tool_loop("<think>\nCall add.\n</think>\n\n"), TOOLS)
    assert report.append_only and report.checked == 1 and report.breaks == ()
    assert "append-only" in str(report)


def test_an_empty_think_block_is_dropped_from_history(tokenizer: Any) -> None:
    # A thinking model emits an empty <think></think> before a tool call; the template
    # renders the turn without it once a tool answer follows.
    report = check_append_only(tokenizer, tool_loop(""), TOOLS)
    (brk,) = report.breaks
    assert brk.rendered.startswith("<think>\n\n</think>")
    assert brk.re_rendered.startswith("<tool_call>")


def test_a_conversation_without_assistant_turns_has_nothing_to_check(tokenizer: Any) -> None:
    report = check_append_only(tokenizer, [{"role": "user", "content": "hi"}])
    assert report.append_only and report.checked == 0
