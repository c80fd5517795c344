"""The session server driven by the real openai client against the text stand-in engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import anyio
import openai
import pytest

from miles_lite.agentic.assembly import assemble_samples, full_prompts
from miles_lite.agentic.server import SessionServerConfig
from miles_lite.errors import ClosedResourceError, SessionError
from miles_lite.testing import TextPolicy, TextStandInConfig, token_logprob
from miles_lite.types import Sample, SampleStatus

from .conftest import TOOLS, Clients, OpenStack

pytestmark = pytest.mark.anyio

ADD = [{"role": "user", "content": "Please add 2 and 3."}]
JSON = {"Content-Type": "application/json"}


async def tool_agent(oa: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    """Ask, run the tool call, answer: two turns; returns the final messages."""
    messages: list[dict[str, Any]] = list(ADD)
    first = await oa.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    second = await oa.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "The sum is \\boxed{5}."
    return messages


async def test_tool_calling_agent_yields_one_merged_sample_with_engine_ids(
    stack: OpenStack, clients: Clients, tokenizer: Any
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        await tool_agent(clients(session.base_url))
        records = await s.server.close_session(session.id)
    assert len(records) == 2
    for record in records:
        assert record.output_log_probs == [
            token_logprob(i, t) for i, t in enumerate(record.output_ids)
        ]
        assert record.request["logprobs"] is True and record.request["return_meta_info"] is True
        assert "logprob_start_len" not in record.request
        assert record.request["max_tokens"] == 64  # the rollout's max_new_tokens
        assert "messages" not in record.request and record.request["num_tools"] == 1
        assert "logprobs" not in record.response["choices"][0]
    assert [r.request["num_messages"] for r in records] == [1, 3]
    result = await anyio.to_thread.run_sync(
        lambda: assemble_samples(records, Sample(prompt=ADD), decode=tokenizer.decode)
    )
    assert result.mismatches == 0 and len(result.samples) == 1
    sample = result.samples[0]
    first, second = records
    first_prompt, second_prompt = full_prompts(records)
    # Token in: the second turn's prompt is the first turn's ids and what the agent added;
    # its record keeps the added tokens only.
    assert second.prefix_len == len(first_prompt) + len(first.output_ids)
    assert second_prompt[: second.prefix_len] == first_prompt + first.output_ids
    assert sample.tokens == second_prompt + second.output_ids
    between = len(second.prompt_ids)
    assert between > 0
    assert sample.loss_mask == [1] * len(first.output_ids) + [0] * between + [1] * len(
        second.output_ids
    )
    assert sample.rollout_log_probs == (
        first.output_log_probs + [0.0] * between + second.output_log_probs
    )
    assert sample.response_length == len(sample.loss_mask)
    assert sample.status is SampleStatus.COMPLETED
    assert "<tool_response>\n5\n</tool_response>" in sample.response


@pytest.mark.parametrize("token_in", [True, False])
async def test_qwen3_template_dropping_think(
    stack: OpenStack, clients: Clients, tokenizer: Any, token_in: bool
) -> None:
    """Qwen3's template drops a past turn's think block. Token in sends the trajectory's
    own ids (one sample, the think block trained on); templating anew splits the sample."""
    async with stack(server_config=SessionServerConfig(processes=0, token_in=token_in)) as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Think first"}]
        answer = await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        assert "<think>" in (answer.choices[0].message.content or "")
        messages += [
            answer.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "And now?"},
        ]
        await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        records = await s.server.close_session(session.id)
        stats = s.server.statistics()
    result = assemble_samples(records, Sample(prompt=messages))
    prompts = list(full_prompts(records))
    if token_in:
        assert (stats.token_in_turns, stats.templated_turns) == (1, 1)
        assert result.mismatches == 0 and len(result.samples) == 1
        (sample,) = result.samples
        assert sample.tokens == prompts[1] + records[1].output_ids
        think = tokenizer.encode("<think>", add_special_tokens=False)
        first_output = records[0].output_ids
        assert first_output[: len(think)] == think
        start = len(prompts[0])
        assert sample.tokens[start : start + len(first_output)] == first_output
        assert sample.loss_mask[: len(first_output)] == [1] * len(first_output)
    else:
        assert (stats.token_in_turns, stats.templated_turns) == (0, 2)
        assert result.mismatches == 1 and len(result.samples) == 2
        assert [x.tokens for x in result.samples] == [
            p + r.output_ids for p, r in zip(prompts, records, strict=True)
        ]


async def test_agent_rewriting_history_splits_the_sample(
    stack: OpenStack, clients: Clients
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        await oa.chat.completions.create(model="m", messages=ADD, tools=TOOLS)  # type: ignore[arg-type]
        rewritten = [
            {"role": "user", "content": "Please add 2 and 3."},
            {"role": "assistant", "content": "I will not call tools."},
            {"role": "user", "content": "And now?"},
        ]
        await oa.chat.completions.create(model="m", messages=rewritten)  # type: ignore[arg-type]
        records = await s.server.close_session(session.id)
    result = assemble_samples(records, Sample())
    assert result.mismatches == 1 and len(result.samples) == 2


async def test_bearer_key_route_reaches_the_same_session(
    stack: OpenStack, clients: Clients
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        other = await s.server.open_session(s.run)
        oa = clients(s.server.openai_base_url, api_key=session.api_key)
        models = await oa.models.list()
        assert [m.id for m in models.data] == ["miles-lite"]
        await tool_agent(oa)
        assert len(s.server.records(session.id)) == 2
        assert s.server.records(other.id) == []
        # a key of no session is a 404 naming what to do
        with pytest.raises(openai.NotFoundError, match="unknown, expired or closed"):
            await clients(s.server.openai_base_url, "sk-session-nope").chat.completions.create(
                model="m",
                messages=ADD,  # type: ignore[arg-type]
            )
        await s.server.close_session(session.id)
        await s.server.close_session(other.id)


async def test_concurrent_request_on_one_session_is_409(stack: OpenStack, clients: Clients) -> None:
    slow = TextStandInConfig(policy=TextPolicy(default_length=40), token_latency_s=0.01)
    async with stack(engine_config=slow) as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        results: list[Any] = []

        async def ask() -> None:
            try:
                results.append(await oa.chat.completions.create(model="m", messages=ADD))  # type: ignore[arg-type]
            except openai.ConflictError as exc:
                results.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.sleep(0.1)
            tg.start_soon(ask)
        conflicts = [r for r in results if isinstance(r, openai.ConflictError)]
        assert len(conflicts) == 1 and "already has a chat request in flight" in str(conflicts[0])
        assert len(await s.server.close_session(session.id)) == 1
        assert s.server.statistics().conflicts == 1


async def test_http_routes_and_their_errors(stack: OpenStack) -> None:
    config = SessionServerConfig(processes=0, max_body_bytes=4096)
    async with stack(server_config=config) as s, aiohttp.ClientSession() as http:
        url = s.server.url
        manage = {"Authorization": f"Bearer {s.server.management_token}"}
        async with http.post(f"{url}/sessions") as resp:
            assert resp.status == 401  # management needs the server's token
            assert "management token" in (await resp.json())["error"]["message"]
        async with http.post(f"{url}/sessions", headers=manage) as resp:
            assert resp.status == 200
            sid = (await resp.json())["session_id"]
        assert len(sid) == 32 and int(sid, 16) >= 0
        chat = f"{url}/sessions/{sid}/v1/chat/completions"
        async with http.post(chat, data=b"{not json", headers=JSON) as resp:
            assert resp.status == 400
            assert "not JSON" in (await resp.json())["error"]["message"]
        async with http.post(chat, data=b'{"messages": [NaN]}', headers=JSON) as resp:
            assert resp.status == 400  # not JSON by the standard
        async with http.post(chat, data=json.dumps({"messages": ADD}).encode()) as resp:
            assert resp.status == 415  # no Content-Type: application/json
        async with http.post(chat, json={"model": "m"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "messages"
        big = {"messages": [{"role": "user", "content": "x" * 8000}]}
        async with http.post(chat, json=big) as resp:
            assert resp.status == 413
            assert "max_body_bytes" in (await resp.json())["error"]["message"]
        async with http.post(chat, json={"messages": ADD, "tools": TOOLS}) as resp:
            assert resp.status == 200
        async with http.get(f"{url}/sessions/{sid}") as resp:
            assert resp.status == 401
        async with http.get(f"{url}/sessions/{sid}", headers=manage) as resp:
            debug = await resp.json()
            assert len(debug["records"]) == 1
            assert debug["records"][0]["finish_reason"] == "tool_calls"
        async with http.get(f"{url}/sessions/{sid}/v1/models") as resp:
            assert resp.status == 200
        async with http.delete(f"{url}/sessions/{sid}") as resp:
            assert resp.status == 401
        async with http.delete(f"{url}/sessions/{sid}", headers=manage) as resp:
            assert resp.status == 204
        for method, path in (("DELETE", ""), ("GET", ""), ("POST", "/v1/chat/completions")):
            async with http.request(
                method, f"{url}/sessions/{sid}{path}", json={}, headers=manage
            ) as resp:
                assert resp.status == 404
                assert "POST /sessions" in (await resp.json())["error"]["message"]
        async with http.post(f"{url}/v1/chat/completions", json={"messages": ADD}) as resp:
            assert resp.status == 401
        async with http.post(f"{url}/sessions/{sid}/v1/completions", json={}) as resp:
            assert resp.status == 404
            assert "chat/completions" in (await resp.json())["error"]["message"]
        stats = s.server.statistics()
        assert (stats.refused, stats.too_large, stats.recorded) == (4, 1, 1)
        assert stats.unauthorized == 4 and stats.open_sessions == 0
    with pytest.raises(ClosedResourceError):
        await s.server.open_session(s.run)
    with pytest.raises(SessionError):
        await s.server.close_session(sid)


async def test_a_loopback_server_answers_loopback_host_names_only(stack: OpenStack) -> None:
    """DNS rebinding: a page's own name resolving to 127.0.0.1 must not reach sessions."""
    async with stack() as s, aiohttp.ClientSession() as http:
        session = await s.server.open_session(s.run)
        models = f"{session.base_url}/models"
        for host, status in (("evil.example:80", 403), ("localhost", 200), ("127.0.0.1", 200)):
            async with http.get(models, headers={"Host": host}) as resp:
                assert resp.status == status, host
        async with http.post(
            f"{s.server.url}/sessions",
            headers={"Host": "attacker.test", "Authorization": "Bearer x"},
        ) as resp:
            assert resp.status == 403
        assert s.server.statistics().unauthorized == 2
        assert s.server.session_ids() == [session.id]


async def test_streaming_is_one_chunk_then_done(stack: OpenStack, clients: Clients) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        stream = await oa.chat.completions.create(model="m", messages=ADD, tools=TOOLS, stream=True)  # type: ignore[arg-type]
        chunks = [chunk async for chunk in stream]
        assert len(chunks) == 1
        assert chunks[0].choices[0].finish_reason == "tool_calls"
        assert chunks[0].choices[0].delta.tool_calls[0].function.name == "add"  # type: ignore[index,union-attr]
        assert len(await s.server.close_session(session.id)) == 1  # recorded with ids


async def test_engine_error_passes_through_and_other_sessions_go_on(
    stack: OpenStack, clients: Clients
) -> None:
    async with stack() as s:
        bad, good = await s.server.open_session(s.run), await s.server.open_session(s.run)
        # SGLang refuses a bad sampling value: the agent sees the engine's 400.
        with pytest.raises(openai.BadRequestError):
            await clients(bad.base_url).chat.completions.create(
                model="m",
                messages=ADD,
                extra_body={"seed": "many"},  # type: ignore[arg-type]
            )
        await tool_agent(clients(good.base_url))
        assert await s.server.close_session(bad.id) == []
        assert len(await s.server.close_session(good.id)) == 2
        assert s.server.statistics().engine_errors == 1


async def test_engine_gone_mid_session_is_502_with_the_reason(
    stack: OpenStack, clients: Clients
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        await oa.chat.completions.create(model="m", messages=ADD, tools=TOOLS)  # type: ignore[arg-type]
        await s.engines[0].aclose()
        with pytest.raises(openai.APIStatusError) as caught:
            await oa.chat.completions.create(model="m", messages=ADD)  # type: ignore[arg-type]
        assert caught.value.status_code == 502 and "engine failed" in str(caught.value)
        assert len(await s.server.close_session(session.id)) == 1


async def test_agent_disconnect_aborts_its_rid_at_the_engine(stack: OpenStack) -> None:
    slow = TextStandInConfig(policy=TextPolicy(default_length=500), token_latency_s=0.01)
    async with stack(engine_config=slow, max_new_tokens=500) as s, aiohttp.ClientSession() as http:
        session = await s.server.open_session(s.run)
        engine = s.engines[0]
        with anyio.move_on_after(0.3):
            await http.post(f"{session.base_url}/chat/completions", json={"messages": ADD})
        with anyio.fail_after(5):
            while True:
                async with http.get(f"{engine.url}/v1/loads") as resp:
                    loads = (await resp.json())["loads"][0]
                busy = loads["num_running_reqs"] + loads["num_waiting_reqs"]
                if busy == 0 and s.server.statistics().disconnect_aborts == 1:
                    break
                await anyio.sleep(0.02)
        assert [a.get("rid") for a in engine.stats.aborts] != []
        assert len(s.run.in_flight) == 0
        assert await s.server.close_session(session.id) == []


async def test_abort_answers_later_requests_with_abort(stack: OpenStack, clients: Clients) -> None:
    async with stack() as s:
        session, other = await s.server.open_session(s.run), await s.server.open_session(s.run)
        await s.server.abort([session.id])
        answer = await clients(session.base_url).chat.completions.create(
            model="m",
            messages=ADD,  # type: ignore[arg-type]
        )
        assert answer.choices[0].finish_reason == "abort"
        fine = await clients(other.base_url).chat.completions.create(model="m", messages=ADD)  # type: ignore[arg-type]
        assert fine.choices[0].finish_reason == "stop"
        s.run.stop.set()  # the rollout's early stop reaches every session
        stopped = await clients(other.base_url).chat.completions.create(
            model="m",
            messages=ADD,  # type: ignore[arg-type]
        )
        assert stopped.choices[0].finish_reason == "abort"
        assert await s.server.close_session(session.id) == []
        assert len(await s.server.close_session(other.id)) == 1
        assert s.server.statistics().aborted_answers == 2


def test_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        SessionServerConfig(max_body_bytes=1)
    with pytest.raises(ValueError, match="port"):
        SessionServerConfig(port=-1)
    with pytest.raises(ValueError, match="abort_timeout_s"):
        SessionServerConfig(abort_timeout_s=0)
    assert json.dumps(SessionServerConfig().host) == '"127.0.0.1"'


async def test_nothing_is_left_after_the_server_closes(stack: OpenStack, clients: Clients) -> None:
    before = {t.get_name() for t in asyncio.all_tasks()}
    async with stack() as s:
        url = s.server.url
        session = await s.server.open_session(s.run)
        await tool_agent(clients(session.base_url))
        await s.server.open_session(s.run)  # left open: dropped on close
    assert s.server.statistics().open_sessions == 0
    left = {t.get_name() for t in asyncio.all_tasks()} - before
    assert left == set(), left
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"{url}/v1/models")


async def test_closing_a_session_aborts_its_request_in_flight(stack: OpenStack) -> None:
    slow = TextStandInConfig(policy=TextPolicy(default_length=500), token_latency_s=0.01)
    async with stack(engine_config=slow, max_new_tokens=500) as s, aiohttp.ClientSession() as http:
        session = await s.server.open_session(s.run)
        answers: list[Any] = []

        async def ask() -> None:
            async with http.post(
                f"{session.base_url}/chat/completions", json={"messages": ADD}
            ) as r:
                answers.append(await r.json())

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.sleep(0.3)
            assert await s.server.close_session(session.id) == []
        # the engine ended it early with its partial output; nothing was recorded
        (answer,) = answers
        assert answer["choices"][0]["finish_reason"] == "abort"
        assert s.server.statistics().recorded == 0


async def test_each_session_keeps_one_engine(stack: OpenStack, clients: Clients) -> None:
    async with stack(engines=2) as s:
        sessions = [await s.server.open_session(s.run) for _ in range(4)]
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(tool_agent, clients(session.base_url))
        used = [{r.engine_url for r in await s.server.close_session(x.id)} for x in sessions]
    assert all(len(urls) == 1 for urls in used)
    assert set().union(*used) == {e.url for e in s.engines}  # both engines got sessions


async def test_a_long_answer_reaches_the_agent_whole(stack: OpenStack, clients: Clients) -> None:
    long = TextStandInConfig(policy=TextPolicy(default_length=1500))
    async with stack(engine_config=long, max_new_tokens=2000) as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        answer = await oa.chat.completions.create(model="m", messages=ADD, logprobs=True)  # type: ignore[arg-type]
        (record,) = await s.server.close_session(session.id)
    assert len(record.output_ids) == 1501 and answer.usage is not None
    assert answer.usage.completion_tokens == 1501
    assert len(answer.choices[0].logprobs.content or []) == 1501  # type: ignore[union-attr]
