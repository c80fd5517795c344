"""A chat session through the session server, forwarded to the real SGLang server, with
the real openai client: recorded ids are the real server's, the assembled sample lines up,
token in sends the model's own ids back (the real server runs exactly them), and the Qwen3
template's history rewriting is detected."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest

from miles_lite.agentic.assembly import assemble_samples, full_prompts
from miles_lite.agentic.config import SessionServerConfig
from miles_lite.agentic.server import SessionServer
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.text.context import TextContext
from miles_lite.types import Sample
from tests.agentic.agents_plain import SSL_CONTEXT  # also warms openai up, off the loop
from tests.support.sessions import IN_PROCESS

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def session_server(
    url: str,
    tokenizer: Any,
    config: SessionServerConfig | None = None,
    max_new_tokens: int = 6,
    extra: dict[str, Any] | None = None,
) -> AsyncIterator[SessionServer]:
    """A session server over the real server; greedy sampling, so that a turn can be
    replayed to stop where a probe of it ended (a random model rarely stops by itself,
    and merging ends at a turn that is not COMPLETED)."""
    async with (
        EngineClient(EngineClientConfig(total_timeout_s=120.0)) as client,
        Router([url], client, RouterConfig(max_inflight_per_engine=4)) as router,
    ):
        context = TextContext(
            tokenizer,
            router,
            TextSamplingParams(
                max_new_tokens=max_new_tokens, temperature=0.0, extra=dict(extra or {})
            ),
            vocab_size=len(tokenizer),
        )
        async with SessionServer(context, config or IN_PROCESS) as server:
            yield server


def chat_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key="unused",
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT),
    )


async def stop_token(
    server: SessionServer, messages: list[dict[str, Any]], max_tokens: int | None = None
) -> int:
    """The last token of a greedy answer to ``messages`` (a probe session, ``max_tokens``
    long at most): asked to stop at it, the same turn ends with ``finish_reason``
    ``stop``."""
    session = await server.open_session(RunContext(0))
    oa = chat_client(session.base_url)
    try:
        await oa.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens)  # type: ignore[arg-type]
    finally:
        await oa.close()
    (probe,) = await server.close_session(session.id)
    return probe.output_ids[-1]


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


async def test_token_in_sends_the_models_own_ids_and_the_real_server_runs_them(
    sglang_url: str, tokenizer: Any
) -> None:
    """Turn two goes as the trajectory's ids plus the appended messages' tokens: the real
    server's prompt is exactly that (the session server checks it, else 502), and the
    merged sample trains on the model's own first-turn ids, whether or not its text
    re-tokenizes to them."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    async with session_server(sglang_url, tokenizer, max_new_tokens=12) as server:
        stop = await stop_token(server, messages)
        session = await server.open_session(RunContext(0))
        oa = chat_client(session.base_url)
        try:
            first = await oa.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                extra_body={"stop_token_ids": [stop]},
            )
            assert first.choices[0].finish_reason == "stop"
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "And now?"},
            ]
            await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        finally:
            await oa.close()
        records = await server.close_session(session.id)
        stats = server.statistics()
    assert (stats.token_in_turns, stats.templated_turns, stats.engine_errors) == (1, 2, 0)
    one, two = records
    prompt_one, prompt_two = full_prompts(records)
    assert prompt_one == template_ids(tokenizer, messages[:1])
    assert two.prefix_len == len(prompt_one) + len(one.output_ids)
    assert prompt_two[: two.prefix_len] == prompt_one + one.output_ids
    result = assemble_samples(records, Sample(prompt=messages))
    (sample,) = result.samples
    assert result.mismatches == 0
    assert sample.tokens == prompt_two + two.output_ids
    n_one, n_between = len(one.output_ids), len(two.prompt_ids)
    assert sample.loss_mask == [1] * n_one + [0] * n_between + [1] * len(two.output_ids)
    assert sample.tokens[len(prompt_one) : len(prompt_one) + n_one] == one.output_ids
    sample.validate(vocab_size=len(tokenizer))


async def test_rewritten_history_through_the_real_template_is_detected(
    sglang_url: str, tokenizer: Any
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Think first"}]
    # History the model never produced, with a think block the Qwen3 template drops from
    # earlier assistant turns: the second prompt does not extend the first turn (and is
    # templated anew, not sent as token in: the agent did not echo the model's answer).
    rewritten = [
        {"role": "assistant", "content": "<think>\nLet me add.\n</think>\n\nIt is 5."},
        {"role": "user", "content": "And now?"},
    ]
    recorded: dict[int, list[Any]] = {}
    stops: list[int] = []
    for max_trim in (1, 0):
        config = SessionServerConfig(processes=0, max_trim_tokens=max_trim)
        async with session_server(sglang_url, tokenizer, config) as server:
            stop = await stop_token(server, messages, max_tokens=1)
            session = await server.open_session(RunContext(0))
            oa = chat_client(session.base_url)
            try:
                first = await oa.chat.completions.create(
                    model="m",
                    messages=messages,  # type: ignore[arg-type]
                    extra_body={"stop_token_ids": [stop]},
                )
                assert first.choices[0].finish_reason == "stop"
                second: list[Any] = [*messages, *rewritten]
                await oa.chat.completions.create(model="m", messages=second)
            finally:
                await oa.close()
            recorded[max_trim] = await server.close_session(session.id)
            assert server.statistics().token_in_turns == 0
            stops.append(stop)
    for records in recorded.values():
        assert len(records) == 2, records
        prompts = list(full_prompts(records))
        assert prompts[1] == template_ids(tokenizer, [*messages, *rewritten])
        assert "Let me add" not in tokenizer.decode(prompts[1])  # the template dropped it
    # The first turn's output is one stop token, which the template does not render after
    # content the model never wrote: the trim tolerance forgives it (as it forgives a stop
    # token a template re-renders differently); with no tolerance it is a mismatch.
    assert [r[0].output_ids for r in recorded.values()] == [[stop] for stop in stops]
    forgiving = assemble_samples(recorded[1], Sample(prompt=messages))
    assert (forgiving.mismatches, forgiving.trimmed_tokens, len(forgiving.samples)) == (0, 1, 1)
    strict = recorded[0]
    result = assemble_samples(strict, Sample(prompt=messages))
    assert result.mismatches == 1 and len(result.samples) == 2
    assert [x.tokens for x in result.samples] == [
        p + r.output_ids for p, r in zip(full_prompts(strict), strict, strict=True)
    ]


async def test_the_rollouts_logit_bias_reaches_chat_turns_and_ends_them_where_it_says(
    sglang_url: str, tokenizer: Any
) -> None:
    """Issue 31.3: a rollout's ``logit_bias`` reaches the real server's chat endpoint under
    its chat name. Biased towards the end-of-turn token, every turn ends at once with it
    (``stop``); without the bias the same greedy turn runs to its budget."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "user", "content": "Count slowly to one hundred:"}]
    outputs: dict[bool, Any] = {}
    for biased in (False, True):
        extra = {"logit_bias": {str(end): 100.0}} if biased else None
        async with session_server(sglang_url, tokenizer, max_new_tokens=12, extra=extra) as server:
            session = await server.open_session(RunContext(0))
            oa = chat_client(session.base_url)
            try:
                answer = await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            finally:
                await oa.close()
            (record,) = await server.close_session(session.id)
        outputs[biased] = (answer.choices[0].finish_reason, record)
    plain_finish, plain = outputs[False]
    assert plain_finish == "length" and len(plain.output_ids) == 12
    assert end not in plain.output_ids
    biased_finish, biased = outputs[True]
    assert biased_finish == "stop"
    assert biased.output_ids == [end]
    assert biased.request.get("logit_bias") == {str(end): 100.0}
