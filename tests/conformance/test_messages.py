"""Anthropic Messages on the session URLs against the real SGLang server (issue 31.5): the
real ``anthropic`` client, streaming and not, and the same exchange in OpenAI chat form
through the real ``openai`` client record the same prompt ids, output ids, finish reasons
and log-probs (greedy, 1e-4) and assemble to the same tokens and masks; SGLang's own
``/v1/messages`` answers the same greedy turn in the same shape and words."""

from __future__ import annotations

from typing import Any

import anthropic
import anyio
import pytest

from miles_lite.agentic.assembly import assemble_samples
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.types import Sample
from tests.agentic.agents_plain import SSL_CONTEXT
from tests.conformance.test_sessions import chat_client, session_server, template_ids

pytestmark = pytest.mark.anyio

SYSTEM = "You answer briefly."
QUESTION = "What is 2+3?"
AGAIN = "And 4+4?"
#: Each turn's budget: the first ends by it (max_tokens), so both turns are short.
TURN_TOKENS = 5
#: Greedy on the same prompt ids: the same tokens; their log-probs to float32 noise.
LOGPROB_TOLERANCE = 1e-4


def _warm_up() -> None:
    """Pay anthropic's lazy imports at import, not on the loop."""
    with anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="-") as client:
        _ = client.messages


_warm_up()


def claude(base_url: str, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=120,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=SSL_CONTEXT),
    )


async def ask(client: anthropic.AsyncAnthropic, messages: list[Any], *, stream: bool) -> Any:
    if not stream:
        return await client.messages.create(
            model="m", max_tokens=TURN_TOKENS, system=SYSTEM, messages=messages
        )
    async with client.messages.stream(
        model="m", max_tokens=TURN_TOKENS, system=SYSTEM, messages=messages
    ) as events:
        return await events.get_final_message()


async def messages_exchange(client: anthropic.AsyncAnthropic, *, stream: bool) -> list[str]:
    """Two turns in Messages form; the texts of the answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = await ask(client, messages, stream=stream)
    assert first.type == "message" and first.role == "assistant"
    assert first.stop_reason == "max_tokens", first
    assert first.usage.output_tokens == TURN_TOKENS
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": AGAIN},
    ]
    second = await ask(client, messages, stream=stream)
    return [
        "".join(b.text for b in answer.content if b.type == "text") for answer in (first, second)
    ]


async def chat_exchange(oa: Any) -> list[str]:
    """The same two turns in OpenAI chat form."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    first = await oa.chat.completions.create(model="m", messages=messages, max_tokens=TURN_TOKENS)
    assert first.choices[0].finish_reason == "length"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": AGAIN},
    ]
    second = await oa.chat.completions.create(model="m", messages=messages, max_tokens=TURN_TOKENS)
    return [a.choices[0].message.content or "" for a in (first, second)]


def exact(record: TurnRecord) -> tuple[Any, ...]:
    return (record.prompt_ids, record.prefix_len, record.output_ids, record.finish_reason)


async def test_messages_and_chat_forms_record_the_same_turns_on_the_real_server(
    sglang_url: str, tokenizer: Any
) -> None:
    recorded: dict[str, list[TurnRecord]] = {}
    texts: dict[str, list[str]] = {}
    async with session_server(sglang_url, tokenizer, max_new_tokens=32) as server:
        for form in ("chat", "messages", "messages-stream"):
            session = await server.open_session(RunContext(0))
            if form == "chat":
                oa = chat_client(session.base_url)
                try:
                    texts[form] = await chat_exchange(oa)
                finally:
                    await oa.close()
            else:
                client = claude(session.anthropic_base_url, session.api_key)
                try:
                    texts[form] = await messages_exchange(client, stream=form.endswith("stream"))
                finally:
                    await client.close()
            recorded[form] = await server.close_session(session.id)
        stats = server.statistics()
    assert stats.engine_errors == 0
    chat = recorded["chat"]
    assert len(chat) == 2
    assert chat[0].prompt_ids == template_ids(
        tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    )
    assert len(chat[0].output_ids) == TURN_TOKENS
    for form in ("messages", "messages-stream"):
        records = recorded[form]
        assert [exact(r) for r in records] == [exact(r) for r in chat], form
        assert texts[form] == texts["chat"], form
        worst = max(
            abs(a - b)
            for mine, theirs in zip(records, chat, strict=True)
            for a, b in zip(mine.output_log_probs, theirs.output_log_probs, strict=True)
        )
        assert worst < LOGPROB_TOLERANCE, (form, worst)
    samples: dict[str, list[Sample]] = {}
    for form, records in recorded.items():
        result = await anyio.to_thread.run_sync(
            lambda records=records: assemble_samples(
                records, Sample(prompt=[{"role": "user", "content": QUESTION}])
            )
        )
        assert result.mismatches == 0
        samples[form] = result.samples
    # The first turn ended by its budget (not COMPLETED): two samples, the same in each form.
    for form in ("messages", "messages-stream"):
        assert [(x.tokens, x.loss_mask, x.response_length) for x in samples[form]] == [
            (x.tokens, x.loss_mask, x.response_length) for x in samples["chat"]
        ], form


async def test_sglangs_own_messages_answer_matches_a_sessions_messages_answer(
    sglang_url: str, tokenizer: Any
) -> None:
    """SGLang 0.5.23 serves /v1/messages itself: the real client reads its answer, in the
    same shape and, greedy, with the same words as the session server's Messages turn."""
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    direct = claude(sglang_url)
    try:
        own = await direct.messages.create(
            model="m",
            max_tokens=TURN_TOKENS,
            system=SYSTEM,
            messages=messages,
            extra_body={"temperature": 0.0},  # greedy (this client has no such argument)
        )
    finally:
        await direct.close()
    async with session_server(sglang_url, tokenizer, max_new_tokens=32) as server:
        session = await server.open_session(RunContext(0))
        client = claude(session.anthropic_base_url, session.api_key)
        try:
            ours = await ask(client, messages, stream=False)
        finally:
            await client.close()
        (record,) = await server.close_session(session.id)
    for answer in (own, ours):
        assert answer.type == "message" and answer.role == "assistant"
        assert answer.stop_reason == "max_tokens"
        assert [b.type for b in answer.content] == ["text"]
        assert answer.usage.output_tokens == TURN_TOKENS
    assert own.usage.input_tokens == ours.usage.input_tokens == len(record.prompt_ids)
    assert own.content[0].text == ours.content[0].text  # type: ignore[union-attr]
    assert tokenizer.decode(record.output_ids) == ours.content[0].text  # type: ignore[union-attr]
