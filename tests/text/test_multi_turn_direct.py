"""multi_turn called directly: stop between turns, context budgets, tool time, seams."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from miles_lite.errors import ConfigError, ToolError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.testing import ADD_TOOLS
from miles_lite.text.context import TextContext
from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
from miles_lite.text.tokenize import encode, render
from miles_lite.text.tool_calls import ToolCall, ToolCallError
from miles_lite.types import Sample, SampleStatus
from tests.text.conftest import Direct, OpenState

pytestmark = pytest.mark.anyio

TOOLS = ADD_TOOLS  # the stand-in scripts call this "add" tool


def _input(state: Direct, prompt: str) -> GenerateFnInput[TextContext]:
    return state.input(Sample(prompt=prompt), max_new_tokens=32)


def _multi_turn(execute: Any, **options: Any) -> MultiTurn:
    return MultiTurn(MultiTurnOptions(tool_specs=TOOLS, execute_tool=execute, **options))


async def test_tool_specs_reach_the_prompt_and_tool_time_is_recorded(
    text_state: OpenState, tokenizer: Any
) -> None:
    async def slow_add(name: str, arguments: dict[str, Any]) -> str:
        await anyio.sleep(0.2)
        return str(arguments["a"] + arguments["b"])

    async with text_state() as (state, engine):
        inp = _input(state, "Please add 2 and 3.")
        sample = await _multi_turn(slow_add)(inp)
    sample.validate()
    assert sample.status is SampleStatus.COMPLETED and sample.turns == 1
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
            state.run.stop.set()  # the rollout stops early while the tool runs
            return "5"

        sample = await _multi_turn(add_then_stop)(_input(state, "Please add 2 and 3."))
    assert len(engine.stats.requests) == 1
    assert sample.status is SampleStatus.ABORTED and sample.status_reason == "early_stop"
    sample.validate()  # what it has: the first turn and the tool result
    assert sample.loss_mask is not None and sample.loss_mask[-1] == 0


async def test_each_turn_gets_only_the_room_the_context_leaves(text_state: OpenState) -> None:
    async def add(name: str, arguments: dict[str, Any]) -> str:
        return "5"

    async with text_state() as (probe, _):
        messages = [{"role": "user", "content": "Please add 2 and 3."}]
        prompt_len = len(await encode(probe.context, await render(probe.context, messages, TOOLS)))
    context = prompt_len + 60
    async with text_state(max_context_len=context) as (state, engine):
        sample = await _multi_turn(add)(_input(state, "Please add 2 and 3."))
        # A context the prompt fills: nothing is sent.
        state.context.max_context_len = prompt_len
        full = await _multi_turn(add)(_input(state, "Please add 2 and 3."))
    first, second = engine.stats.requests
    assert first["sampling_params"]["max_new_tokens"] == 32
    assert second["sampling_params"]["max_new_tokens"] == min(
        32, context - len(second["input_ids"])
    )
    assert len(sample.tokens) <= context
    assert full.status is SampleStatus.TRUNCATED
    assert full.status_reason == "prompt_too_long"
    assert len(engine.stats.requests) == 2


async def test_a_custom_parser_plugs_in(text_state: OpenState) -> None:
    seen: list[str] = []

    def shouting_parser(text: str) -> list[ToolCall | ToolCallError]:
        seen.append(text)
        return [ToolCall("add", {"a": 1, "b": 1})] if len(seen) == 1 else []

    async def add(name: str, arguments: dict[str, Any]) -> str:
        return str(arguments["a"] + arguments["b"])

    async with text_state() as (state, _):
        sample = await _multi_turn(add, parser=shouting_parser)(_input(state, "What is 2+3?"))
    assert len(seen) == 2 and sample.turns == 1
    assert "<tool_response>\n2\n</tool_response>" in sample.response


async def test_a_call_without_an_execute_function_fails_the_sample(text_state: OpenState) -> None:
    async with text_state() as (state, _):
        with pytest.raises(ToolError, match="execute_tool is not set"):
            await _multi_turn(None)(_input(state, "Please add 2 and 3."))


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"tool_timeout_s": 0}, "tool_timeout_s"),
        ({"tool_specs": {"name": "add"}}, "tool_specs"),
        ({"parser": "qwen"}, "parser"),
        ({"execute_tool": TOOLS}, "execute_tool"),
    ],
)
def test_bad_options_are_config_errors_naming_them(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        MultiTurnOptions(**options)
