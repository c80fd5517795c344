"""The session server's guarantees in both of its modes: in the rollout's process
(``processes=0``) and in worker processes of its own (``processes=2``, slow: it starts
them). One server per mode is shared by the module's tests (a worker start imports the
library and the tokenizer: seconds); counters are asserted as deltas."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import openai
import pytest

from miles_lite import TextRollout, TextRolloutConfig
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.agentic.config import SessionServerStatistics
from miles_lite.agentic.server import SessionServer, SessionServerConfig
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import ConfigError, SessionError, WorkerCrashedError
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.text.context import TextContext
from miles_lite.types import SampleStatus
from tests.support.polling import wait_until
from tests.support.processes import alive

from . import agents
from .conftest import RULES, TOOLS, Claudes, Clients
from .test_messages import messages_tool_agent, readme_block
from .test_server import ADD, tool_agent

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "Say hi"}]
#: A prompt no rule matches: 500 tokens at 2 ms each, a turn that stays in flight.
LONG = [{"role": "user", "content": "Tell me everything."}]
#: The modes: in-process, and two worker processes (sessions spread over both).
MODES = [
    pytest.param(0, id="in_process"),
    pytest.param(2, marks=pytest.mark.slow, id="workers2"),
]


@dataclass
class Served:
    """A stand-in engine, its router and context, and a session server over them."""

    engine: TextStandInEngine
    router: Router
    context: TextContext
    server: SessionServer

    async def delta(self, before: SessionServerStatistics) -> dict[str, int]:
        """The counters that changed since ``before``, by how much."""
        now = dataclasses.asdict(await self.server.collect_statistics())
        was = dataclasses.asdict(before)
        return {k: now[k] - was[k] for k in now if now[k] != was[k] and k != "open_sessions"}


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


@asynccontextmanager
async def serving(tokenizer: Any, config: SessionServerConfig) -> AsyncIterator[Served]:
    engine_config = TextStandInConfig(
        policy=TextPolicy(rules=RULES, default_length=500), token_latency_s=0.002
    )
    async with (
        TextStandInEngine(engine_config, tokenizer) as engine,
        EngineClient(EngineClientConfig(total_timeout_s=30.0)) as client,
        Router([engine.url], client, RouterConfig(max_inflight_per_engine=16)) as router,
    ):
        context = TextContext(
            tokenizer, router, TextSamplingParams(max_new_tokens=500), vocab_size=len(tokenizer)
        )
        async with SessionServer(context, config) as server:
            yield Served(engine, router, context, server)


@pytest.fixture(scope="module", params=MODES)
async def served(request: pytest.FixtureRequest, tokenizer: Any) -> AsyncIterator[Served]:
    config = SessionServerConfig(
        processes=request.param, max_body_bytes=8192, body_timeout_s=1.0, header_timeout_s=2.0
    )
    async with serving(tokenizer, config) as s:
        yield s


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def turn_keys(records: list[TurnRecord]) -> list[tuple[Any, ...]]:
    return [
        (r.prompt_ids, r.prefix_len, r.output_ids, r.output_log_probs, r.finish_reason)
        for r in records
    ]


def chat_url(base_url: str) -> str:
    return f"{base_url}/chat/completions"


async def test_each_turn_is_recorded_once_with_token_in(served: Served, clients: Clients) -> None:
    server = served.server
    before = await server.collect_statistics()
    session = await server.open_session(RunContext(0))
    client = clients(session.base_url)
    first = await client.chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    # The record was sent to the rollout's process before the agent's answer.
    await wait_until(lambda: len(server.records(session.id)) == 1)
    messages = [*HI, first.choices[0].message.model_dump(exclude_none=True)]
    messages.append({"role": "user", "content": "And now?"})
    await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    records = await server.close_session(session.id)
    assert len(records) == 2 and records[1].prefix_len > 0
    assert records[1].engine_url == served.engine.url
    assert await served.delta(before) == {
        "opened": 1,
        "closed": 1,
        "requests": 2,
        "recorded": 2,
        "token_in_turns": 1,
        "templated_turns": 1,
    }


async def test_a_workers_collector_runs_rarely(served: Served, clients: Clients) -> None:
    # A worker freezes what it holds once started and collects its young objects every
    # 10,000 (a turn's are freed by reference counting); CPython's 700 ran 4 collections
    # in 40 of these turns. In-process the rollout's collector is its user's.
    server = served.server
    if not server.config.worker_count:
        pytest.skip("worker processes only")
    before = await server.collect_statistics()
    for _ in range(30):
        session = await server.open_session(RunContext(0))
        await tool_agent(clients(session.base_url))
        assert len(await server.close_session(session.id)) == 2
    assert (await served.delta(before)).get("worker_gc_collections", 0) <= 1


async def test_token_in_ids_are_the_same_in_both_modes(served: Served, clients: Clients) -> None:
    if not served.server.config.worker_count:
        pytest.skip("compares a worker-process server with an in-process one")
    got = []
    async with SessionServer(served.context, SessionServerConfig(processes=0)) as local:
        for server in (served.server, local):
            session = await server.open_session(RunContext(0))
            await tool_agent(clients(session.base_url))
            got.append(turn_keys(await server.close_session(session.id)))
    assert got[0] == got[1] and len(got[0]) == 2


async def test_the_answer_holds_what_the_agent_asked_for(
    served: Served, http: aiohttp.ClientSession
) -> None:
    everything = {"logprobs": True, "return_prompt_token_ids": True, "return_meta_info": True}
    choices = []
    for asked in ({}, everything):  # each a first turn, in a session of its own
        session = await served.server.open_session(RunContext(0))
        async with http.post(chat_url(session.base_url), json={"messages": HI, **asked}) as resp:
            assert resp.status == 200
            choices.append((await resp.json())["choices"][0])
        assert len(await served.server.close_session(session.id)) == 1
    plain, whole = choices
    assert plain["logprobs"] is None and not {"prompt_token_ids", "meta_info"} & plain.keys()
    assert whole["logprobs"]["content"] and whole["prompt_token_ids"] and whole["meta_info"]
    assert plain["message"] == whole["message"]


async def test_sessions_are_found_by_url_key_or_header_and_refused_otherwise(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server = served.server
    session = await server.open_session(RunContext(0))
    root = session.base_url.split("/sessions/")[0]
    before = await server.collect_statistics()
    body = {"messages": HI}
    async with http.post(chat_url(f"{root}/sessions/{'0' * 32}/v1"), json=body) as resp:
        assert resp.status == 404 and "unknown" in (await resp.json())["error"]["message"]
    async with http.post(f"{root}/v1/chat/completions", json=body) as resp:
        assert resp.status == 401
    async with http.post(
        f"{root}/v1/chat/completions", json=body, headers={"Host": "evil.example"}
    ) as resp:
        assert resp.status == 403
    bearer = {"Authorization": f"Bearer {session.api_key}"}
    async with http.post(f"{root}/v1/chat/completions", json=body, headers=bearer) as resp:
        assert resp.status == 200
    named = {"X-Session-Id": session.id}
    async with http.post(f"{root}/v1/chat/completions", json=body, headers=named) as resp:
        assert resp.status == 200
    assert len(await server.close_session(session.id)) == 2
    async with http.post(chat_url(session.base_url), json=body) as resp:
        assert resp.status == 404  # closed: its worker forgot it too
    delta = await served.delta(before)
    assert (delta["not_found"], delta["unauthorized"], delta["recorded"]) == (2, 2, 2)


async def test_bodies_too_large_not_json_or_not_chat_are_refused(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server = served.server
    session = await server.open_session(RunContext(0))
    url = chat_url(session.base_url)
    before = await server.collect_statistics()
    huge = {"messages": [{"role": "user", "content": "x" * 10_000}]}
    async with http.post(url, json=huge) as resp:
        assert resp.status == 413 and "8192 bytes" in (await resp.json())["error"]["message"]
    async with http.post(url, data=b"{nope", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
    async with http.post(url, data=b"hi", headers={"Content-Type": "text/plain"}) as resp:
        assert resp.status == 415
    async with http.post(url, json={"messages": HI, "temperature_x": 1}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "temperature_x"
    assert await server.close_session(session.id) == []
    delta = await served.delta(before)
    assert (delta["too_large"], delta["refused"], delta.get("recorded", 0)) == (1, 3, 0)


async def test_a_slow_body_is_cut_off_and_does_not_hold_its_session(
    served: Served, clients: Clients
) -> None:
    server = served.server
    session = await server.open_session(RunContext(0))
    host, port = session.base_url.removeprefix("http://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        (
            f"POST /sessions/{session.id}/v1/chat/completions HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 200\r\n\r\n{"
        ).encode()
    )
    await writer.drain()
    await anyio.sleep(0.2)  # its body is being read
    turn = await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert turn.choices[0].message.content == "Hi there."  # not a 409
    assert (await reader.read(200)).startswith(b"HTTP/1.1 408")
    writer.close()
    assert len(await server.close_session(session.id)) == 1


async def test_a_second_request_in_flight_on_a_session_is_409(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server = served.server
    session = await server.open_session(RunContext(0))
    before = await server.collect_statistics()
    statuses: list[int] = []

    async def ask() -> None:
        async with http.post(chat_url(session.base_url), json={"messages": LONG}) as resp:
            statuses.append(resp.status)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await wait_until(lambda: served.engine.stats.running > 0)
        await anyio.sleep(0.05)
        tg.start_soon(ask)
    assert sorted(statuses) == [200, 409]
    assert len(await server.close_session(session.id)) == 1
    assert (await served.delta(before))["conflicts"] == 1


async def test_abort_and_the_runs_stop_answer_abort_at_once(
    served: Served, clients: Clients
) -> None:
    server = served.server
    run = RunContext(0)
    session, other = await server.open_session(run), await server.open_session(run)
    before = await server.collect_statistics()
    await server.abort([session.id])
    answer = await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "abort"
    fine = await clients(other.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert fine.choices[0].finish_reason == "stop"
    run.stop.set()  # the rollout's early stop reaches every session
    stopped = await clients(other.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert stopped.choices[0].finish_reason == "abort"
    assert await server.close_session(session.id) == []
    assert len(await server.close_session(other.id)) == 1
    delta = await served.delta(before)
    assert (delta["aborted_answers"], delta["recorded"]) == (2, 1)


async def test_an_agent_that_disconnects_has_its_rid_aborted_at_the_engine(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server, engine = served.server, served.engine
    run = RunContext(0)
    session = await server.open_session(run)
    before = await server.collect_statistics()
    aborts = len(engine.stats.aborts)
    with anyio.move_on_after(0.3):
        await http.post(chat_url(session.base_url), json={"messages": LONG})
    await wait_until(lambda: len(engine.stats.aborts) > aborts)
    await wait_until(lambda: len(run.in_flight) == 0)
    assert await server.close_session(session.id) == []
    delta = await served.delta(before)
    assert delta["disconnect_aborts"] == 1 and delta.get("recorded", 0) == 0


async def test_closing_a_session_aborts_its_turn_in_flight_and_records_nothing(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server = served.server
    session = await server.open_session(RunContext(0))
    answers: list[Any] = []

    async def ask() -> None:
        async with http.post(chat_url(session.base_url), json={"messages": LONG}) as resp:
            answers.append(await resp.json())

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await wait_until(lambda: served.engine.stats.running > 0)
        await anyio.sleep(0.2)
        assert await server.close_session(session.id) == []
    (answer,) = answers
    assert answer["choices"][0]["finish_reason"] == "abort"
    with pytest.raises(SessionError):
        server.records(session.id)


async def test_a_messages_exchange_records_what_the_same_chat_exchange_records(
    served: Served, clients: Clients, claude: Claudes
) -> None:
    server = served.server
    chat = await server.open_session(RunContext(0))
    oa_client = clients(chat.base_url)
    messages = list(ADD)
    first = await oa_client.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "You add numbers."}, *messages],  # type: ignore[list-item]
        tools=TOOLS,  # type: ignore[arg-type]
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    await oa_client.chat.completions.create(
        model="m",
        messages=[  # type: ignore[arg-type]
            {"role": "system", "content": "You add numbers."},
            *messages,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    session = await server.open_session(RunContext(0))
    text = await messages_tool_agent(
        claude(session.anthropic_base_url, session.api_key), stream=True
    )
    assert text == "The sum is \\boxed{5}."
    from_chat = await server.close_session(chat.id)
    from_messages = await server.close_session(session.id)
    assert turn_keys(from_chat) == turn_keys(from_messages) and len(from_chat) == 2


async def test_the_management_endpoints_answer_at_the_servers_own_url(
    served: Served, http: aiohttp.ClientSession
) -> None:
    server = served.server
    manage = {"Authorization": f"Bearer {server.management_token}"}
    async with http.post(f"{server.url}/sessions") as resp:
        assert resp.status == 401
    async with http.post(f"{server.url}/sessions", headers=manage) as resp:
        created = await resp.json()
    sid, base_url = created["session_id"], created["base_url"]
    if server.config.worker_count:
        assert not base_url.startswith(f"{server.url}/")  # its worker's own port
    async with http.post(chat_url(base_url), json={"messages": HI}) as resp:
        assert resp.status == 200
    async with http.get(f"{server.url}/sessions/{sid}", headers=manage) as resp:
        (record,) = (await resp.json())["records"]
    assert record["finish_reason"] == "stop" and record["output_token_ids"]
    async with http.delete(f"{server.url}/sessions/{sid}", headers=manage) as resp:
        assert resp.status == 204
    assert sid not in server.session_ids()


@pytest.mark.parametrize("processes", MODES)
async def test_idle_sessions_expire_and_leaving_stops_every_worker(
    tokenizer: Any, clients: Clients, processes: int
) -> None:
    config = SessionServerConfig(processes=processes, idle_ttl_s=0.4)
    async with serving(tokenizer, config) as s:
        pids = s.server.worker_pids()
        assert len(pids) == processes
        abandoned = [await s.server.open_session(RunContext(0)) for _ in range(6)]
        await clients(abandoned[0].base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        await wait_until(lambda: s.server.statistics().open_sessions == 0)
        assert (await s.server.collect_statistics()).expired == 6
        with pytest.raises(openai.NotFoundError):
            await clients(abandoned[1].base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert s.server.worker_pids() == [] and not [p for p in pids if alive(p)]


async def test_a_worker_that_dies_is_replaced_and_the_rollout_goes_on(
    served: Served, clients: Clients
) -> None:
    # Last in the module: it kills one of the shared server's workers.
    server = served.server
    if not server.config.worker_count:
        pytest.skip("worker processes only")
    run = RunContext(0)
    sessions = [await server.open_session(run) for _ in range(2)]  # one on each worker
    for session in sessions:
        await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    victim = sessions[0]
    pids = server.worker_pids()
    port = victim.base_url.split("/sessions/")[0]
    doomed = [p for p in pids if _serves(p, port)]
    (pid,) = doomed
    os.kill(pid, signal.SIGKILL)
    await wait_until(lambda: server.statistics().worker_exits == 1, timeout_s=60)
    with pytest.raises(openai.APIConnectionError):
        await clients(victim.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    # Its records so far stay; the other worker's session goes on; a new worker serves.
    assert len(await server.close_session(victim.id)) == 1
    more = await clients(sessions[1].base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
    assert more.choices[0].finish_reason == "stop"
    await wait_until(lambda: len(server.worker_pids()) == 2, timeout_s=60)
    assert pid not in server.worker_pids()
    fresh = [await server.open_session(run) for _ in range(2)]
    for session in fresh:
        await clients(session.base_url).chat.completions.create(model="m", messages=HI)  # type: ignore[arg-type]
        assert len(await server.close_session(session.id)) == 1
    assert len(await server.close_session(sessions[1].id)) == 2


def _serves(pid: int, base: str) -> bool:
    """Whether process ``pid`` listens on the port of ``base`` (``http://host:port``)."""
    import psutil

    port = int(base.rsplit(":", 1)[1])
    return any(c.laddr and c.laddr.port == port for c in psutil.Process(pid).net_connections())


def test_the_default_serves_agents_from_at_least_one_worker_process() -> None:
    # The README's claim: "auto" by default, at least one worker on any machine (1-2 cores
    # included); in the rollout's process only when asked for (processes=0).
    default = SessionServerConfig()
    assert default.processes == "auto" and default.worker_count >= 1
    assert AgentGenerate(agents.run_agent).session_config == default
    assert SessionServerConfig(processes=0).worker_count == 0


def test_processes_is_a_count_or_auto_and_names_itself_otherwise() -> None:
    assert SessionServerConfig(processes=3).worker_count == 3
    auto = SessionServerConfig(processes="auto").worker_count
    assert auto == max(1, min(4, (os.cpu_count() or 1) - 1))
    for bad in (-1, True, "many", 1.5):
        with pytest.raises(ConfigError, match="processes"):
            SessionServerConfig(processes=bad)  # type: ignore[arg-type]


class _TokenizerLostOnTheWay:
    """Pickles, but cannot be unpickled: a worker that fails while it starts."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_refuse_to_load, ())


def _refuse_to_load() -> None:
    raise RuntimeError("this tokenizer does not load in a worker")


@pytest.mark.slow
async def test_a_worker_that_fails_to_start_fails_the_servers_start_by_name(
    served: Served,
) -> None:
    if not served.server.config.worker_count:
        pytest.skip("worker processes only")
    context = dataclasses.replace(served.context, tokenizer=_TokenizerLostOnTheWay())
    server = SessionServer(context, SessionServerConfig(processes=1))
    with pytest.raises(WorkerCrashedError, match="exited with code 1 while starting"):
        async with server:
            pass
    assert server.worker_pids() == []


@pytest.mark.slow
async def test_an_agent_rollout_with_worker_processes_gives_the_in_process_samples(
    tokenizer: Any,
) -> None:
    """The README's process-mode lines through TextRollout: the default (worker
    processes) gives the samples of the same rollout served in-process."""
    namespace: dict[str, Any] = {
        "AgentGenerate": AgentGenerate,
        "SessionServerConfig": SessionServerConfig,
        "run_agent": agents.run_agent,
    }
    exec(readme_block("Agents: OpenAI chat through session URLs", 2), namespace)
    default, in_process = namespace["generate"], namespace["in_process"]
    assert default.session_config.worker_count >= 1
    assert in_process.session_config.worker_count == 0
    got = []
    for generate in (default, in_process):
        async with (
            TextStandInEngine(
                TextStandInConfig(policy=TextPolicy(rules=RULES)), tokenizer
            ) as engine,
            TextRollout.open(
                [engine.url],
                tokenizer=tokenizer,
                config=TextRolloutConfig(
                    n_samples_per_prompt=2, sampling=TextSamplingParams(max_new_tokens=64)
                ),
                generate=generate,
            ) as rollout,
        ):
            result = await rollout.run([ADD])
            workers = len(generate.server.worker_pids())
            assert workers == generate.server.config.worker_count
            assert generate.server.session_ids() == []  # every session was closed
        for sample in result.samples:
            assert sample.status is SampleStatus.COMPLETED, sample.error
        got.append(
            sorted(
                (s.tokens, s.loss_mask, s.rollout_log_probs, s.reward, s.turns)
                for s in result.samples
            )
        )
    assert got[0] == got[1]
