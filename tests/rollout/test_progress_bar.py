"""The progress bar outside a terminal (a log, a pipe, CI): each finished bar keeps its
line, so the next bar or message starts on a line of its own, never glued onto it."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from miles_lite import PromptGroup, TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.rewards.text_rewards import math_reward
from miles_lite.testing import TextPolicy, TextRule, TextStandInConfig, TextStandInEngine

RULE = TextRule(r"What is 2\+3", "It is \\boxed{5}.")


@pytest.mark.anyio
async def test_bars_and_messages_after_them_start_their_own_lines(
    tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = TextRolloutConfig(
        n_samples_per_prompt=2, sampling=TextSamplingParams(max_new_tokens=8), reward="math"
    )
    engine_config = TextStandInConfig(policy=TextPolicy(rules=[RULE]))
    async with (
        TextStandInEngine(engine_config, tokenizer) as engine,
        TextRollout.open(
            [engine.url],
            tokenizer=tokenizer,
            config=config,
            rewards={"math": math_reward},
            progress=True,
        ) as rollout,
    ):
        prompts = [PromptGroup(prompt="What is 2+3?", label="5")] * 3
        for _ in range(2):
            result = await rollout.run(prompts)
            assert len(result.samples) == 6
            print("timeline skipped: a message after the bar", file=sys.stderr)
    err = capsys.readouterr().err
    assert not sys.stderr.isatty()
    # Each bar is one line of its own (tqdm redraws it after a carriage return) that ends
    # finished, and the message after it is the next line.
    bar, message, bar_again, message_again, end = err.split("\n")
    for line in (bar, bar_again):
        assert line.startswith("\rrollout:   0%") and "rollout: 100%|" in line, repr(err)
    assert message == message_again == "timeline skipped: a message after the bar"
    assert end == ""
