"""multi_turn called directly: stop between turns, context budgets, tool time, seams."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from miles_lite.errors import ConfigError, ToolError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.testing import ADD_TOOLS
from miles_lite.text import multi_turn
from miles_lite.text.context import TextState
from miles_lite.text.multi_turn import MultiTurnOptions
from miles_lite.text.tool_calls import ToolCall, ToolCallError
from miles_lite.types import Sample, SampleStatus
from tests.text.conftest import OpenState

pytestmark = pytest.mark.anyio

TOOLS = ADD_TOOLS  # the stand-in scripts call this "add" tool


def _input(state: TextState, prompt: str, execute: Any, **options: Any) -> GenerateFnInput:
    return GenerateFnInput(
        samples=[Sample(prompt=prompt)],
        sampling_params={**state.sampling.to_payload(), "max_new_tokens": 32},
        state=state,
        options={
            "generate_tool_specs_path": TOOLS,
            "generate_execute_tool_function_path": execute,
            **options,
        },
    )


async def test_tool_specs_reach_the_prompt_and_tool_time_is_recorded(
    text_state: OpenState, tokenizer: Any
) -> None:
    async def slow_add(name: str, arguments: dict[str, Any]) -> str:
        await anyio.sleep(0.2)
        return str(arguments["a"] + arguments["b"])

    async with text_state() as (state, engine):
        inp = _input(state, "Please add 2 and 3.", slow_add)
        sample = await multi_turn.generate(inp)
    sample.validate()
    assert sample.status is SampleStatus.COMPLETED and sample.metadata["turns"] == 1
    first_prompt = tokenizer.decode(engine.stats.requests[0]["input_ids"])
    assert '"name": "add"' in first_prompt and "<tools>" in first_prompt
    assert 0.2 <= sample.non_generation_time == inp.span.non_generation_time_s < 5
    assert inp.span.requests == 2 and inp.span.generate_end is not None
    assert len(sample.weight_versions) == 2
    assert sample.prefix_cache_info.total_prompt_tokens == sum(
        len(r["input_ids"]) for r in engine.stats.requests
    )


async def test_after_an_early_stop_no_new_turn_is_sent(text_state: OpenState) -> None:
    async with text_state() as (state, engine):

        async def add_then_stop(name: str, arguments: dict[str, Any]) -> str:
            state.request_stop()  # the rollout stops early while the tool runs
            return "5"

        sample = await multi_turn.generate(_input(state, "Please add 2 and 3.", add_then_stop))
    assert len(engine.stats.requests) == 1
    assert sample.status is SampleStatus.ABORTED
    sample.validate()  # what it has: the first turn and the tool result
    assert sample.loss_mask is not None and sample.loss_mask[-1] == 0


async def test_each_turn_gets_only_the_room_the_context_leaves(text_state: OpenState) -> None:
    async def add(name: str, arguments: dict[str, Any]) -> str:
        return "5"

    async with text_state() as (probe, _):
        prompt_len = len(
            await multi_turn._encode(
                probe,
                await multi_turn._render(
                    probe, [{"role": "user", "content": "Please add 2 and 3."}], TOOLS, True
                ),
            )
        )
    context = prompt_len + 60
    async with text_state(max_context_len=context) as (state, engine):
        sample = await multi_turn.generate(_input(state, "Please add 2 and 3.", add))
        # A context the prompt fills: nothing is sent.
        state.max_context_len = prompt_len
        full = await multi_turn.generate(_input(state, "Please add 2 and 3.", add))
    first, second = engine.stats.requests
    assert first["sampling_params"]["max_new_tokens"] == 32
    assert second["sampling_params"]["max_new_tokens"] == min(
        32, context - len(second["input_ids"])
    )
    assert len(sample.tokens) <= context
    assert full.status is SampleStatus.TRUNCATED
    assert full.metadata["truncated_reason"] == "prompt_too_long"
    assert len(engine.stats.requests) == 2


async def test_a_custom_parser_plugs_in(text_state: OpenState) -> None:
    seen: list[str] = []

    def shouting_parser(text: str) -> list[ToolCall | ToolCallError]:
        seen.append(text)
        return [ToolCall("add", {"a": 1, "b": 1})] if len(seen) == 1 else []

    async def add(name: str, arguments: dict[str, Any]) -> str:
        return str(arguments["a"] + arguments["b"])

    async with text_state() as (state, _):
        sample = await multi_turn.generate(
            _input(state, "What is 2+3?", add, generate_tool_call_parser=shouting_parser)
        )
    assert len(seen) == 2 and sample.metadata["turns"] == 1
    assert "<tool_response>\n2\n</tool_response>" in sample.response


async def test_a_call_without_an_execute_function_fails_the_sample(text_state: OpenState) -> None:
    async with text_state() as (state, _):
        with pytest.raises(ToolError, match="no execute_tool"):
            await multi_turn.generate(_input(state, "Please add 2 and 3.", None))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"generate_max_turns": 0}, "generate_max_turns"),
        ({"generate_max_turns": True}, "generate_max_turns"),
        ({"generate_tool_timeout_s": 0}, "generate_tool_timeout_s"),
        ({"generate_tool_specs_path": {"name": "add"}}, "generate_tool_specs_path"),
        ({"generate_tool_specs_path": "no_such_module.TOOLS"}, "no_such_module"),
        (
            {"generate_execute_tool_function_path": "tests.text.test_multi_turn_direct.TOOLS"},
            "not callable",
        ),
    ],
)
def test_bad_options_are_config_errors_naming_them(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        MultiTurnOptions.from_options(options)


def test_tool_specs_may_come_from_a_function() -> None:
    resolved = MultiTurnOptions.from_options({"generate_tool_specs_path": lambda: TOOLS})
    assert resolved.tool_specs == TOOLS
