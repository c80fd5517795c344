"""Anthropic Messages on the session URLs, driven by the real ``anthropic`` client against
the text stand-in: the same exchange in Messages form and in OpenAI chat form gives the
same records (prompt ids, output ids, log-probs, token in) and the same merged sample;
streaming, system prompts, tool_use / tool_result blocks; a session named in an
``X-Session-Id`` header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import anyio
import pytest

from miles_lite.agentic.assembly import assemble_samples
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.testing import token_logprob
from miles_lite.types import Sample, SampleStatus

from .conftest import TOOLS, Clients, OpenStack, Stack
from .test_server import ADD

pytestmark = pytest.mark.anyio

SYSTEM = "You add numbers."
#: The stand-in's add tool in Messages' shape.
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"].get("description", ""),
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


def _warm_up() -> None:
    """Pay anthropic's lazy imports at import, not on the loop."""
    with anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="-") as client:
        _ = client.messages


_warm_up()


async def messages_tool_agent(client: anthropic.AsyncAnthropic, *, stream: bool) -> str:
    """The exchange of ``tool_agent`` in Messages form (with a system prompt); returns the
    final text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ADD[0]["content"]}]

    async def ask() -> Any:
        if not stream:
            return await client.messages.create(
                model="m",
                max_tokens=64,
                system=SYSTEM,
                messages=messages,  # type: ignore[arg-type]
                tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
            )
        async with client.messages.stream(
            model="m",
            max_tokens=64,
            system=SYSTEM,
            messages=messages,  # type: ignore[arg-type]
            tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
        ) as events:
            return await events.get_final_message()

    first = await ask()
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("add", {"a": 2, "b": 3})
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}],
        }
    )
    second = await ask()
    assert second.stop_reason == "end_turn"
    return "".join(block.text for block in second.content if block.type == "text")


async def chat_records(s: Stack, clients: Clients) -> list[TurnRecord]:
    session = await s.server.open_session(s.run)
    oa = clients(session.base_url)
    messages = list(ADD)
    first = await oa.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": SYSTEM}, *messages],  # type: ignore[list-item]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    second_messages = [
        {"role": "system", "content": SYSTEM},
        *messages,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = await oa.chat.completions.create(model="m", messages=second_messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "The sum is \\boxed{5}."
    return await s.server.close_session(session.id)


def same_turns(a: list[TurnRecord], b: list[TurnRecord]) -> list[tuple[Any, ...]]:
    def key(r: TurnRecord) -> tuple[Any, ...]:
        return (r.prompt_ids, r.prefix_len, r.output_ids, r.output_log_probs, r.finish_reason)

    assert [key(r) for r in a] == [key(r) for r in b]
    return [key(r) for r in a]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_messages_exchange_records_what_the_same_chat_exchange_records(
    stack: OpenStack, clients: Clients, claude: Any, tokenizer: Any, stream: bool
) -> None:
    async with stack() as s:
        chat = await chat_records(s, clients)
        session = await s.server.open_session(s.run)
        client = claude(session.anthropic_base_url, session.api_key)
        assert await messages_tool_agent(client, stream=stream) == "The sum is \\boxed{5}."
        messages = await s.server.close_session(session.id)
        stats = s.server.statistics()
    turns = same_turns(messages, chat)
    assert len(turns) == 2
    assert stats.token_in_turns == 2  # the second turn of each session: token in
    for record in messages:
        assert record.output_log_probs == [
            token_logprob(i, t) for i, t in enumerate(record.output_ids)
        ]
        assert record.request["num_tools"] == 1 and record.request["max_tokens"] == 64
    samples = []
    for records in (messages, chat):
        result = await anyio.to_thread.run_sync(
            lambda records=records: assemble_samples(
                records, Sample(prompt=ADD), decode=tokenizer.decode
            )
        )
        assert result.mismatches == 0 and len(result.samples) == 1
        samples.append(result.samples[0])
    from_messages, from_chat = samples
    assert from_messages.status is SampleStatus.COMPLETED
    assert (from_messages.tokens, from_messages.loss_mask, from_messages.rollout_log_probs) == (
        from_chat.tokens,
        from_chat.loss_mask,
        from_chat.rollout_log_probs,
    )
    assert from_messages.weight_versions == from_chat.weight_versions
    assert tokenizer.decode(from_messages.tokens).count(SYSTEM) == 1


async def test_messages_refusals_come_in_messages_error_shape(
    stack: OpenStack, claude: Any
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        client = claude(session.anthropic_base_url, session.api_key)
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"logit_bias": {"1": 5}},
            )
        assert caught.value.body["type"] == "error"  # type: ignore[index]
        assert "'logit_bias' is not accepted here" in caught.value.body["error"]["message"]  # type: ignore[index]
        wrong = claude(session.anthropic_base_url.rsplit("/", 1)[0] + "/nope", session.api_key)
        with pytest.raises(anthropic.NotFoundError):
            await wrong.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        # Through the fixed /v1/messages, the client's x-api-key picks the session.
        keyed = claude(s.server.url, session.api_key)
        answer = await keyed.messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "Say hi"}]
        )
        assert answer.content[0].text == "Hi there."  # type: ignore[union-attr]
        assert len(s.server.records(session.id)) == 1


async def test_a_session_named_in_an_x_session_id_header_is_served(stack: OpenStack) -> None:
    async with stack() as s, aiohttp.ClientSession() as http:
        session = await s.server.open_session(s.run)
        body = {"model": "m", "messages": [{"role": "user", "content": "Say hi"}]}
        headers = {"X-Session-Id": session.id}
        async with http.post(
            f"{s.server.url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"] == "Hi there."
        async with http.post(
            f"{s.server.url}/v1/messages", json={**body, "max_tokens": 8}, headers=headers
        ) as response:
            assert response.status == 200
            answer = await response.json()
        assert answer["type"] == "message" and answer["content"][0]["text"] == "Hi there."
        async with http.post(
            f"{s.server.url}/v1/messages", json=body, headers={"X-Session-Id": "nope"}
        ) as response:
            assert response.status == 404
            assert (await response.json())["type"] == "error"
        assert len(s.server.records(session.id)) == 2


def readme_block(heading: str, index: int) -> str:
    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n")[index + 1].split("```", 1)[0]


async def test_the_readmes_anthropic_snippet_runs_against_a_session(stack: OpenStack) -> None:
    namespace: dict[str, Any] = {}
    exec(readme_block("Agents: OpenAI chat through session URLs", 1), namespace)
    async with stack() as s:
        session = await s.server.open_session(s.run)
        said = await namespace["run_claude_agent"](session, [{"role": "user", "content": "Say hi"}])
        records = await s.server.close_session(session.id)
    assert said == "Hi there." and len(records) == 1
