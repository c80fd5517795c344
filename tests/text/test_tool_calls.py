"""The Qwen/Hermes tool-call parser: calls, malformed calls, the parser seam."""

from __future__ import annotations

import time

from miles_lite.text.tool_calls import (
    MAX_CALLS,
    TOOL_CALL_PARSERS,
    ToolCall,
    ToolCallError,
    parse_qwen_tool_calls,
)


def test_calls_are_parsed_in_order_with_object_or_quoted_arguments() -> None:
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": "{\\"q\\": \\"pi\\"}"}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call><|im_end|>'
    )
    assert parse_qwen_tool_calls(text) == [
        ToolCall("add", {"a": 2, "b": 3}),
        ToolCall("lookup", {"q": "pi"}),
        ToolCall("now", {}),
    ]


def test_no_call_is_an_empty_list() -> None:
    assert parse_qwen_tool_calls("The answer is \\boxed{5}.<|im_end|>") == []
    assert parse_qwen_tool_calls("<tool_call> never closed") == []


def test_malformed_calls_say_what_is_wrong() -> None:
    (bad_json,) = parse_qwen_tool_calls("<tool_call>\n{not json}\n</tool_call>")
    assert isinstance(bad_json, ToolCallError)
    assert bad_json.raw == "{not json}" and "malformed tool call JSON" in bad_json.reason
    (no_name,) = parse_qwen_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert isinstance(no_name, ToolCallError) and '"name"' in no_name.reason
    (bad_args,) = parse_qwen_tool_calls('<tool_call>{"name": "f", "arguments": "{x"}</tool_call>')
    assert isinstance(bad_args, ToolCallError) and "arguments" in bad_args.reason
    (list_args,) = parse_qwen_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')
    assert isinstance(list_args, ToolCallError) and "JSON object" in list_args.reason
    # A good call next to a bad one is still a call.
    mixed = parse_qwen_tool_calls(
        '<tool_call>{oops}</tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>'
    )
    assert isinstance(mixed[0], ToolCallError) and mixed[1] == ToolCall("f", {})


def test_the_flag_names_resolve_to_parsers() -> None:
    assert {"qwen", "qwen25", "hermes"} <= set(TOOL_CALL_PARSERS)
    assert all(callable(p) for p in TOOL_CALL_PARSERS.values())


def test_a_degenerate_turn_is_parsed_in_linear_time() -> None:
    # A policy stuck repeating an unclosed call (~16k tokens of it): the old lazy regex
    # took minutes on the event loop (1.4 s at 1k repeats, 64 s at 8k). Counted in CPU
    # time of this thread, so another process's load does not count.
    degenerate = "<tool_call> {" * 8000
    start = time.thread_time()
    assert parse_qwen_tool_calls(degenerate) == []
    closed_once = degenerate + '</tool_call><tool_call>{"name": "f"}</tool_call>'
    first, second = parse_qwen_tool_calls(closed_once)
    assert time.thread_time() - start < 0.05
    assert isinstance(first, ToolCallError) and second == ToolCall("f", {})


def test_nesting_too_deep_and_too_many_calls_are_told_not_raised() -> None:
    (deep,) = parse_qwen_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert isinstance(deep, ToolCallError) and "nested too deeply" in deep.reason
    many = parse_qwen_tool_calls('<tool_call>{"name": "f"}</tool_call>' * (MAX_CALLS + 5))
    assert len(many) == MAX_CALLS + 1 and isinstance(many[-1], ToolCallError)
    assert all(call == ToolCall("f", {}) for call in many[:MAX_CALLS])
