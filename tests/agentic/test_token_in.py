"""Token in across agent turns: after the first turn the session server sends the engine
the trajectory's own ids plus the appended messages' tokens, so a model turn whose ids are
not the tokenizer's spelling of its text stays in one trajectory."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from transformers import AutoTokenizer

from miles_lite.agentic.assembly import assemble_samples, full_prompts
from miles_lite.agentic.server import SessionServerConfig
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.testing import (
    TextPolicy,
    TextRule,
    TextStandInConfig,
    load_qwen3_tokenizer,
    qwen3_tokenizer_dir,
)
from miles_lite.types import Sample, SampleStatus

from .conftest import RULES, TOOLS, Clients, OpenStack

pytestmark = pytest.mark.anyio

#: Three "\n" tokens: a model may write them; the tokenizer spells "\n\n\n" as one token.
NEWLINES = (198, 198, 198)
NEWLINE_RULES = (
    TextRule(r"Count to three", token_ids=NEWLINES),
    TextRule(r"Once more", token_ids=NEWLINES),
    *RULES,
)

#: A plain ChatML template (Qwen2/2.5 style, no think handling), written here.
CHATML = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}"
    "{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for call in m.tool_calls %}"
    "{%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{- call.function.arguments | tojson if call.function.arguments is mapping"
    " else call.function.arguments }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


async def three_turns(oa: Any) -> list[dict[str, Any]]:
    """Two turns the model answers with three "\\n" tokens, then a third."""
    messages: list[dict[str, Any]] = []
    for ask in ("Count to three", "Once more", "And now?"):
        messages.append({"role": "user", "content": ask})
        answer = await oa.chat.completions.create(model="m", messages=messages)
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
    return messages


async def tool_session(oa: Any) -> None:
    """A tool call, its result, the answer, then two more user turns: four turns."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Please add 2 and 3."}]
    for then in ("tool", "And now?", "Say hi", None):
        answer = await oa.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = answer.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if then == "tool":
            call = message.tool_calls[0]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
        elif then is not None:
            messages.append({"role": "user", "content": then})


def output_spans(records: list[TurnRecord]) -> list[tuple[int, int]]:
    """Where each turn's output lies in the trajectory (token positions)."""
    spans = []
    for record, prompt in zip(records, full_prompts(records), strict=True):
        spans.append((len(prompt), len(prompt) + len(record.output_ids)))
    return spans


@pytest.mark.parametrize("token_in", [True, False])
async def test_a_model_turn_that_does_not_round_trip_stays_one_trajectory(
    stack: OpenStack, clients: Clients, tokenizer: Any, token_in: bool
) -> None:
    assert tokenizer.encode("\n\n\n", add_special_tokens=False) != list(NEWLINES)
    engine = TextStandInConfig(policy=TextPolicy(rules=NEWLINE_RULES))
    config = SessionServerConfig(processes=0, token_in=token_in)
    async with stack(engine_config=engine, server_config=config) as s:
        session = await s.server.open_session(s.run)
        messages = await three_turns(clients(session.base_url))
        records = await s.server.close_session(session.id)
        stats = s.server.statistics()
    assert [r.output_ids[:3] for r in records[:2]] == [list(NEWLINES)] * 2
    result = await anyio.to_thread.run_sync(
        lambda: assemble_samples(records, Sample(prompt=messages[:1]), decode=tokenizer.decode)
    )
    if not token_in:
        # Re-templated, the history holds the tokenizer's spelling: every turn splits.
        assert (stats.token_in_turns, stats.templated_turns) == (0, 3)
        assert result.mismatches == 2 and len(result.samples) == 3
        return
    assert (stats.token_in_turns, stats.templated_turns, stats.engine_errors) == (2, 1, 0)
    assert result.mismatches == 0
    (sample,) = result.samples
    prompts = list(full_prompts(records))
    assert sample.tokens == prompts[-1] + records[-1].output_ids
    # The model's own ids are kept, and trained on exactly: mask 1 on each turn's output,
    # 0 on what the template put between, log-probs the engine's.
    start = len(prompts[0])
    mask = [0] * start + (sample.loss_mask or [])
    for record, (begin, end) in zip(records, output_spans(records), strict=True):
        assert sample.tokens[begin:end] == record.output_ids
        assert mask[begin:end] == [1] * (end - begin)
    assert sum(mask) == sum(len(r.output_ids) for r in records)
    log_probs = [0.0] * start + list(sample.rollout_log_probs or [])
    for record, (begin, end) in zip(records, output_spans(records), strict=True):
        assert log_probs[begin:end] == record.output_log_probs
    assert sample.status is SampleStatus.COMPLETED


@pytest.mark.parametrize("template", ["qwen3", "chatml"])
async def test_token_in_agrees_with_the_template_where_the_text_round_trips(
    stack: OpenStack, clients: Clients, template: str
) -> None:
    """Templates that render each message from itself and its neighbour's role are exact:
    with text that round-trips, the token-in prompts are the template's, token for token
    (tool calls and tool results included)."""
    tokenizer = load_qwen3_tokenizer()
    if template == "chatml":  # a copy: the loaded tokenizer is shared by every test
        tokenizer = await anyio.to_thread.run_sync(
            lambda: AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
        )
        tokenizer.chat_template = CHATML
    prompts: dict[bool, list[list[int]]] = {}
    for token_in in (True, False):
        async with stack(
            server_config=SessionServerConfig(processes=0, token_in=token_in), tokenizer=tokenizer
        ) as s:
            session = await s.server.open_session(s.run)
            oa = clients(session.base_url)
            await tool_session(oa)
            records = await s.server.close_session(session.id)
            assert s.server.statistics().token_in_turns == (3 if token_in else 0)
        prompts[token_in] = list(full_prompts(records))
    assert len(prompts[True]) == 4
    assert prompts[True] == prompts[False]
