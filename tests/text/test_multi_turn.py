"""MultiTurn over /generate in a rollout: tool turns masked out, tool failures, max turns."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from miles_lite import SampleStatus
from miles_lite.errors import ToolError
from miles_lite.testing import ADD_TOOLS, TextPolicy, TextRule, TextStandInConfig, token_logprob
from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
from tests.text.conftest import RULES, OpenRollout

pytestmark = pytest.mark.anyio

TOOLS = ADD_TOOLS  # the stand-in scripts call this "add" tool


async def add(name: str, arguments: dict[str, Any]) -> str:
    assert name == "add"
    return str(arguments["a"] + arguments["b"])


def multi_turn(**overrides: Any) -> MultiTurn:
    return MultiTurn(MultiTurnOptions(**{"tool_specs": TOOLS, "execute_tool": add, **overrides}))


async def test_a_tool_turn_is_masked_out_with_log_prob_zero(
    text_rollout: OpenRollout, tokenizer: Any
) -> None:
    async with text_rollout(generate=multi_turn(), n_samples_per_prompt=1) as (rollout, (engine,)):
        result = await rollout.run([[{"role": "user", "content": "Please add 2 and 3."}]])
    (sample,) = result.samples
    sample.validate()
    assert sample.status is SampleStatus.COMPLETED and sample.turns == 1
    first, second = engine.stats.requests
    prompt_len = len(first["input_ids"])
    assert sample.tokens[:prompt_len] == first["input_ids"]
    response = sample.tokens[prompt_len:]
    mask, log_probs = sample.loss_mask, sample.rollout_log_probs
    assert mask is not None and isinstance(log_probs, list)
    # model turn 1 (mask 1) | tool result and template glue (mask 0) | model turn 2 (mask 1)
    k = mask.index(0)
    m = mask[k:].index(1)
    assert k > 0 and m > 0 and mask == [1] * k + [0] * m + [1] * (len(mask) - k - m)
    assert log_probs[k : k + m] == [0.0] * m
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(response[k : k + m])
    # The second turn was sent with everything so far, not re-tokenized.
    assert second["input_ids"] == sample.tokens[: prompt_len + k + m]
    # Model tokens carry the engine's log-probs, turn by turn.
    assert log_probs[:k] == [token_logprob(i, t) for i, t in enumerate(response[:k])]
    turn2 = response[k + m :]
    assert log_probs[k + m :] == [token_logprob(i, t) for i, t in enumerate(turn2)]
    assert "\\boxed{5}" in sample.response


async def test_malformed_tool_json_is_answered_with_a_tool_message(
    text_rollout: OpenRollout, tokenizer: Any
) -> None:
    async with text_rollout(
        generate=multi_turn(max_turns=2),
        n_samples_per_prompt=1,
    ) as (rollout, (engine,)):
        result = await rollout.run(["Use the broken tool please."])
    (sample,) = result.samples
    # The model was told, and (scripted) answered the tool message.
    assert sample.status is SampleStatus.COMPLETED and sample.turns == 1
    second = tokenizer.decode(engine.stats.requests[1]["input_ids"])
    assert "malformed tool call JSON" in second


@pytest.mark.parametrize("failure", ["raises", "hangs"])
async def test_a_tool_that_fails_fails_its_sample_only(
    text_rollout: OpenRollout, failure: str
) -> None:
    async def bad_tool(name: str, arguments: dict[str, Any]) -> str:
        if failure == "raises":
            raise RuntimeError("tool exploded")
        await anyio.sleep(30)
        return ""

    async with text_rollout(
        generate=multi_turn(execute_tool=bad_tool, tool_timeout_s=0.2),
        n_samples_per_prompt=1,
    ) as (rollout, _):
        result = await rollout.run(["Please add 2 and 3.", "What is 2+3?"])
    broken, fine = result.samples
    assert isinstance(broken.error, ToolError)
    assert ("exploded" if failure == "raises" else "timeout") in str(broken.error)
    assert broken.error.__cause__ is not None
    assert fine.status is SampleStatus.COMPLETED


async def test_max_turns_ends_the_sample_truncated(text_rollout: OpenRollout) -> None:
    async def always_more(name: str, arguments: dict[str, Any]) -> str:
        return "call again"

    loop = TextRule(r"call again|add 2", RULES[1].response)  # every turn calls the tool
    async with text_rollout(
        engine_config=TextStandInConfig(policy=TextPolicy(rules=[loop])),
        generate=multi_turn(max_turns=3, execute_tool=always_more),
        n_samples_per_prompt=1,
    ) as (rollout, (engine,)):
        result = await rollout.run(["Please add 2 and 3."])
    (sample,) = result.samples
    assert len(engine.stats.requests) == 3 and sample.turns == 3
    assert sample.status is SampleStatus.TRUNCATED
    assert sample.status_reason == "max_turns"
    sample.validate()
