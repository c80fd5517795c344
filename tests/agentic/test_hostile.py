"""The session server under hostile agents and broken engines: what each one sees now."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import openai
import pytest
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.agentic.server import SessionServerConfig
from miles_lite.engine.config import RouterConfig
from miles_lite.testing import TextPolicy, TextStandInConfig
from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine
from tests.support.polling import wait_until

from .conftest import RULES, Clients, OpenStack

pytestmark = pytest.mark.anyio

ADD = [{"role": "user", "content": "Please add 2 and 3."}]
HI = [{"role": "user", "content": "Say hi"}]
CHAT = "/v1/chat/completions"
SLOW = TextStandInConfig(policy=TextPolicy(rules=RULES, default_length=500), token_latency_s=0.01)


@asynccontextmanager
async def scripted(*replies: Reply, default: Reply | None = None) -> AsyncIterator[ScriptedEngine]:
    """A scripted engine answering chat with ``replies``, then ``default``."""
    engine = ScriptedEngine()
    engine.script(CHAT, *replies)
    if default is not None:
        engine.defaults[CHAT] = default
    runner = await start_engine(engine)
    try:
        yield engine
    finally:
        await runner.cleanup()


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, **headers: str
) -> tuple[int, Any]:
    headers.setdefault("Content-Type", "application/json")
    async with http.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_the_rollouts_sampling_wins_and_refused_fields_are_named(
    stack: OpenStack, clients: Clients
) -> None:
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        # The agent asks for a hotter, longer turn: recorded with the rollout's settings.
        await oa.chat.completions.create(model="m", messages=HI, temperature=2.0, max_tokens=999)
        await oa.chat.completions.create(model="m", messages=HI, max_tokens=3)
        refusals = []
        for extra in (
            {"n": 3},
            {"custom_logit_processor": "x"},
            {"lora_path": "/tmp/adapter"},
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "http://10.0.0.1/x.png"}}
                        ],
                    }
                ]
            },
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                await oa.chat.completions.create(model="m", messages=HI, extra_body=extra)
            refusals.append(caught.value.body)
        records = await s.server.close_session(session.id)
        stats = s.server.statistics()
    first, second = records
    assert first.request["temperature"] == 1.0 and first.request["max_tokens"] == 64
    assert second.request["max_tokens"] == 3 and len(second.output_ids) <= 3
    assert [r["param"] for r in refusals] == [
        "n",
        "custom_logit_processor",
        "lora_path",
        "messages",
    ]  # type: ignore[index]
    assert stats.refused == 4 and stats.recorded == 2


async def test_a_stream_flag_that_is_not_a_bool_is_refused(stack: OpenStack) -> None:
    async with stack() as s, aiohttp.ClientSession() as http:
        session = await s.server.open_session(s.run)
        status, body = await post(
            http,
            f"{session.base_url}/chat/completions",
            b'{"messages": [{"role": "user", "content": "Say hi"}], "stream": "false"}',
        )
        assert status == 400 and body["error"]["param"] == "stream"
        assert s.server.records(session.id) == []


async def test_a_turn_waiting_for_an_engine_slot_at_the_stop_is_never_sent(
    stack: OpenStack, clients: Clients
) -> None:
    config = RouterConfig(max_inflight_per_engine=1)
    async with stack(router_config=config) as s:
        session = await s.server.open_session(s.run)
        engine = s.engines[0]
        answers: list[Any] = []

        async def turn() -> None:
            answers.append(
                await clients(session.base_url).chat.completions.create(model="m", messages=HI)
            )  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg, s.router.lease():  # the only slot
            tg.start_soon(turn)
            await wait_until(lambda: len(s.run.in_flight) == 1)
            await anyio.sleep(0.05)  # at the lease, waiting
            s.run.stop.set()
        (answer,) = answers
        assert answer.choices[0].finish_reason == "abort"
        assert engine.stats.chat_requests == 0  # never sent: it would have run to its end
        assert await s.server.close_session(session.id) == []
        assert s.server.statistics().aborted_answers == 1


async def test_a_timed_out_turn_is_aborted_at_its_engine(
    stack: OpenStack, clients: Clients
) -> None:
    config = SessionServerConfig(processes=0, engine_timeout_s=0.3)
    async with stack(engine_config=SLOW, server_config=config, max_new_tokens=500) as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        with pytest.raises(openai.APIStatusError) as caught:
            await oa.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "go on"}]
            )  # type: ignore[arg-type]
        assert caught.value.status_code == 502 and "engine failed" in str(caught.value)
        engine = s.engines[0]
        assert len(engine.stats.aborts) == 1  # the engine hears of it
        await wait_until(lambda: engine.stats.running == 0)
        assert engine.stats.generated_tokens < 500
        # The session goes on.
        answer = await oa.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        assert answer.choices[0].message.content == "Hi there."
        stats = s.server.statistics()
        assert (stats.timeout_aborts, stats.engine_errors, stats.recorded) == (1, 1, 1)


async def test_a_503_turn_is_sent_once_then_to_another_engine(
    stack: OpenStack, clients: Clients
) -> None:
    async with scripted(default=Reply(503, b"overloaded")) as down, stack(before=[down.url]) as s:
        answers = []
        for _ in range(2):  # the least loaded engine first: the one answering 503
            session = await s.server.open_session(s.run)
            answers.append(
                await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
            )
            assert len(await s.server.close_session(session.id)) == 1
    assert [a.choices[0].message.content for a in answers] == ["Hi there."] * 2
    assert 1 <= down.count(CHAT) <= 2  # each turn at most once there, never re-sent to it
    rids = [seen.body for seen in down.seen if seen.path == CHAT]
    assert len(set(rids)) == len(rids)


async def test_an_agents_bad_requests_do_not_take_the_engine_out_of_rotation(
    stack: OpenStack, clients: Clients
) -> None:
    """Five 500s and five 400s caused by an agent's own requests: the engine stays in."""
    async with (
        scripted(default=Reply(500, b"agent's fault")) as picky,
        stack(engines=0, before=[picky.url]) as s,
    ):
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        for _ in range(5):
            with pytest.raises(openai.InternalServerError):
                await oa.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        (state,) = s.router.statistics().engines
        assert state.healthy
    assert picky.count(CHAT) == 5  # each sent once, none re-sent
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        for _ in range(5):
            with pytest.raises(openai.BadRequestError):
                await oa.chat.completions.create(model="m", messages=HI, seed="x")  # type: ignore[arg-type]
        assert all(e.healthy for e in s.router.statistics().engines)
        with anyio.fail_after(5):  # another session is served at once
            other = await s.server.open_session(s.run)
            await clients(other.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]


async def test_json_that_nests_too_deep_or_holds_nan_is_answered_not_crashed(
    stack: OpenStack,
) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    async with (
        scripted(Reply(200, deep, "application/json")) as broken,
        stack(engines=0, before=[broken.url]) as s,
        aiohttp.ClientSession() as http,
    ):
        session = await s.server.open_session(s.run)
        chat = f"{session.base_url}/chat/completions"
        for body in (deep, b'{"messages": [{"role": "user", "content": NaN}]}'):
            status, answer = await post(http, chat, body)
            assert status == 400 and "not JSON" in answer["error"]["message"]
        # The engine's answer nests too deep: a 502 naming the engine and rid.
        status, answer = await post(
            http, chat, b'{"messages": [{"role": "user", "content": "hi"}]}'
        )
        assert status == 502 and broken.url in answer["error"]["message"]
        async with http.get(f"{session.base_url}/models") as resp:
            assert resp.status == 200  # still serving
        stats = s.server.statistics()
        assert (stats.refused, stats.engine_errors, stats.recorded) == (2, 1, 0)


async def test_a_server_other_hosts_can_reach_takes_session_keys_only(
    stack: OpenStack, clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    config = SessionServerConfig(processes=0, host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="miles_lite.agentic.server"):
        async with stack(server_config=config) as s, aiohttp.ClientSession() as http:
            session = await s.server.open_session(s.run)
            assert session.base_url == s.server.openai_base_url  # no session URL
            by_path = f"{s.server.url}/sessions/{session.id}/v1/chat/completions"
            status, answer = await post(http, by_path, b'{"messages": []}')
            assert status == 401 and "Bearer" in answer["error"]["message"]
            oa = clients(session.base_url, api_key=session.api_key)
            await oa.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
            assert len(s.server.records(session.id)) == 1
    assert any("reachable from other hosts" in r.getMessage() for r in caplog.records)


async def test_slow_clients_are_cut_off_and_do_not_hold_their_session(
    stack: OpenStack, clients: Clients
) -> None:
    config = SessionServerConfig(processes=0, header_timeout_s=0.5, body_timeout_s=0.5)
    async with stack(server_config=config) as s:
        session = await s.server.open_session(s.run)
        host, port = s.server.url.removeprefix("http://").split(":")
        path = f"/sessions/{session.id}/v1/chat/completions"

        async def slow_headers() -> float:
            reader, writer = await asyncio.open_connection(host, int(port))
            started = anyio.current_time()
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
            try:
                for _ in range(40):  # a header byte every 0.1 s, never finishing
                    await anyio.sleep(0.1)
                    writer.write(b"X")
                    await writer.drain()
                    if reader.at_eof():
                        break
                await reader.read()
            except ConnectionError:
                pass
            finally:
                writer.close()
            return anyio.current_time() - started

        async def slow_body() -> bytes:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
                ).encode()
            )
            await writer.drain()
            answer = await reader.read(200)
            writer.close()
            return answer

        cut: list[float] = []
        async with anyio.create_task_group() as tg:

            async def headers() -> None:
                cut.append(await slow_headers())

            tg.start_soon(headers)
            answer = await slow_body()
            # While the slow body was held, the session was free for its real turn.
            assert answer.startswith(b"HTTP/1.1 408")
        assert cut and cut[0] < 3.0
        turn = await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        assert turn.choices[0].finish_reason == "stop"
        assert s.server.statistics().conflicts == 0


async def test_idle_sessions_expire_and_records_are_kept_compact(
    stack: OpenStack, clients: Clients
) -> None:
    config = SessionServerConfig(processes=0, idle_ttl_s=0.4)
    async with stack(server_config=config) as s:
        abandoned = [await s.server.open_session(s.run) for _ in range(50)]
        await clients(abandoned[0].base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        await wait_until(lambda: s.server.statistics().open_sessions == 0)
        assert s.server.statistics().expired == 50
        with pytest.raises(openai.NotFoundError):
            await clients(abandoned[1].base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    # A 20-turn session keeps about its trajectory's ids, not every turn's whole prompt.
    async with stack() as s:
        session = await s.server.open_session(s.run)
        oa = clients(session.base_url)
        messages: list[dict[str, Any]] = []
        for i in range(20):
            messages.append({"role": "user", "content": f"Say hi {i}"})
            answer = await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            messages.append(answer.choices[0].message.model_dump(exclude_none=True))
        records = await s.server.close_session(session.id)
    held = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
    trajectory = records[-1].prefix_len + len(records[-1].prompt_ids) + len(records[-1].output_ids)
    assert held == trajectory
    full = sum(r.prefix_len + len(r.prompt_ids) + len(r.output_ids) for r in records)
    assert full > 8 * held  # what keeping each whole prompt would hold


async def test_an_engine_that_ignores_input_ids_is_caught(
    stack: OpenStack, clients: Clients
) -> None:
    """An engine that templates the messages instead of running the ids sent (an SGLang
    without chat input_ids): the turn is a 502 saying so, never a silently wrong record."""
    async with stack() as real, aiohttp.ClientSession() as http:
        target = real.engines[0].url

        async def forward(request: web.Request) -> web.Response:
            body = await request.json()
            body.pop("input_ids", None)  # ignored, as an older engine would
            async with http.post(f"{target}{request.path}", json=body) as resp:
                return web.Response(
                    status=resp.status, body=await resp.read(), content_type="application/json"
                )

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post(CHAT, forward)
        app.router.add_get("/health", health)
        runner, url = await serve_app(app, "127.0.0.1", 0)
        try:
            async with stack(engines=0, before=[url]) as s:
                session = await s.server.open_session(s.run)
                oa = clients(session.base_url)
                messages: list[dict[str, Any]] = [{"role": "user", "content": "Think first"}]
                answer = await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
                messages += [
                    answer.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "And now?"},
                ]
                with pytest.raises(openai.APIStatusError) as caught:
                    await oa.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
                assert caught.value.status_code == 502
                assert "another prompt than the input_ids sent" in str(caught.value)
                assert len(s.server.records(session.id)) == 1
        finally:
            await runner.cleanup()
