"""A chat session through the session server, forwarded to the real SGLang server, with
the real openai client: recorded ids are the real server's, the assembled sample lines up,
and the Qwen3 template's history rewriting is detected."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from miles_lite.agentic.assembly import assemble_samples
from miles_lite.agentic.server import SessionServer
from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.types import Sample
from tests.agentic.agents_plain import SSL_CONTEXT  # also warms openai up, off the loop

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def session_server(url: str, tokenizer: Any) -> AsyncIterator[SessionServer]:
    async with (
        EngineClient(EngineClientConfig(total_timeout_s=120.0)) as client,
        Router([url], client, RouterConfig(max_inflight_per_engine=4)) as router,
        SessionServer(router, TextSamplingParams(max_new_tokens=6)) as server,
    ):
        yield server


def chat_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT),
    )


def template_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return ids if isinstance(ids, list) else list(ids["input_ids"])


async def test_one_turn_session_records_the_real_servers_ids(
    sglang_url: str, tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "What is 2+3?"}]
    async with session_server(sglang_url, tokenizer) as server:
        session = await server.open_session(RunContext(0))
        oa = chat_client(session.base_url)
        try:
            answer = await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        finally:
            await oa.close()
        records = await server.close_session(session.id)
    assert answer.choices[0].finish_reason in ("stop", "length")
    (record,) = records
    assert record.engine_url == sglang_url
    # The ids the real server templated are the real Qwen3 template's.
    assert record.prompt_ids == template_ids(tokenizer, messages)
    assert 0 < len(record.output_ids) <= 6
    assert len(record.output_log_probs) == len(record.output_ids)
    assert all(lp <= 0.0 for lp in record.output_log_probs)
    result = assemble_samples(records, Sample(prompt=messages))
    (sample,) = result.samples
    assert result.mismatches == 0
    assert sample.tokens == record.prompt_ids + record.output_ids
    assert sample.response_length == len(record.output_ids)
    assert sample.loss_mask == [1] * len(record.output_ids)
    assert list(sample.rollout_log_probs or []) == record.output_log_probs
    sample.validate()


async def test_rewritten_history_through_the_real_template_is_detected(
    sglang_url: str, tokenizer: Any
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Think first"}]
    async with session_server(sglang_url, tokenizer) as server:
        session = await server.open_session(RunContext(0))
        oa = chat_client(session.base_url)
        try:
            # A random model rarely stops by itself, and merging ends at a turn that is not
            # COMPLETED: bias <|im_end|> so the first turn stops at once.
            first = await oa.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                logit_bias={str(tokenizer.convert_tokens_to_ids("<|im_end|>")): 100},
            )
            assert first.choices[0].finish_reason == "stop"
            # History the model never produced, with a think block the Qwen3 template drops
            # from earlier assistant turns: the second prompt does not extend the first turn.
            messages += [
                {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\nIt is 5."},
                {"role": "user", "content": "And now?"},
            ]
            await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        finally:
            await oa.close()
        records = await server.close_session(session.id)
    assert len(records) == 2, records
    assert records[1].prompt_ids == template_ids(tokenizer, messages)
    assert "Let me add" not in tokenizer.decode(records[1].prompt_ids)  # the template dropped it
    # The first turn's output is the stop token alone, which the trim tolerance would
    # forgive (the template re-renders it as "<|im_end|>\n" after content the model never
    # wrote); with no tolerance the rewritten history is a mismatch.
    assert records[0].output_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    forgiving = assemble_samples(records, Sample(prompt=messages))
    assert (forgiving.mismatches, forgiving.trimmed_tokens, len(forgiving.samples)) == (0, 1, 1)
    result = assemble_samples(records, Sample(prompt=messages), max_trim_tokens=0)
    assert result.mismatches == 1 and len(result.samples) == 2
    assert [x.tokens for x in result.samples] == [r.prompt_ids + r.output_ids for r in records]
