"""A plain-string prompt is sent without the chat template, a messages list with it, and
the README, ``run()`` and ``--prompt-data`` say so (issue 30 C)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miles_lite.cli._args import build_parser
from miles_lite.training.rollout import Rollout
from tests.text.conftest import OpenRollout

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"


async def test_a_string_prompt_skips_the_template_and_a_messages_list_gets_it(
    text_rollout: OpenRollout, tokenizer: Any
) -> None:
    text = "What is 2+3?"
    messages = [{"role": "user", "content": text}]
    async with text_rollout(n_samples_per_prompt=1) as (rollout, _):
        plain, chat = (await rollout.run([text, messages])).samples
    plain_ids = tokenizer.encode(text, add_special_tokens=False)
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    chat_ids = chat_ids if isinstance(chat_ids, list) else list(chat_ids["input_ids"])
    assert plain.tokens[: len(plain.tokens) - plain.response_length] == plain_ids
    assert chat.tokens[: len(chat.tokens) - chat.response_length] == chat_ids


def test_the_readme_run_and_the_cli_help_say_which_prompts_get_the_template() -> None:
    section = README.read_text().split("## Text rollouts\n", 1)[1].split("\n## ", 1)[0]
    assert "a plain string prompt" in section and "without the chat template" in section
    doc = " ".join((Rollout.run.__doc__ or "").split())
    assert "a plain string is sent as it is, tokenized without the chat template" in doc
    _, commands = build_parser()
    help_text = " ".join(commands["text"].format_help().split())
    assert (
        "--prompt-data FILE prompts, JSONL: a string prompt is sent as it is (no chat" in help_text
    )
