"""One contract for both transports to the engines: the aiohttp client on the loop and the
blocking exchange a parser worker makes itself (``fetch_in_parser``).

A request the engine received is never sent again (a timeout after sending, a reset after
sending, an answer that stalls past the total timeout); only what never reached an engine
(a refused connection) and 502/503/504 answers are retried, on another engine. Counted at
the engines, not timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.blocking import BlockingRequest
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineError, EngineTimeoutError, EngineUnavailableError
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.testing import StandInConfig, synthetic_body
from tests.support.engine_fakes import listening_socket

pytestmark = pytest.mark.anyio

PATH = "/rollout/generate"
PAYLOAD = {"prompt": "a cat", "seed": 1, "num_inference_steps": 1, "num_outputs_per_prompt": 1}
BODY = synthetic_body(PAYLOAD, StandInConfig(latent_height=4, latent_width=4))
CLIENT = EngineClientConfig(
    connect_timeout_s=1.0,
    read_timeout_s=0.5,
    total_timeout_s=1.5,
    retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.01),
)
ROUTER = RouterConfig(max_inflight_per_engine=4, health_interval_s=60.0, failure_threshold=100)

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


class Engine:
    """A bare HTTP/1.1 server counting the generations it read whole (``received``), then
    answering ``answer``; the router's /health probes get a 200."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.received = 0
        self.url = ""
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                if not head.startswith(b"POST"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                self.received += 1
                await self.answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def ok(writer: asyncio.StreamWriter) -> None:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: {len(BODY)}\r\n\r\n"
    writer.write(head.encode() + BODY)
    await writer.drain()


async def unavailable(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
    await writer.drain()


async def silent(writer: asyncio.StreamWriter) -> None:
    await anyio.sleep(3600)  # got the request, never answers: the read timeout fires


async def reset(writer: asyncio.StreamWriter) -> None:
    raise ConnectionError  # got the request, closes the connection without answering


async def stall(writer: asyncio.StreamWriter) -> None:
    # Headers, then a byte every 0.2 s: no read times out, the total timeout does.
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: 1000\r\n\r\n"
    )
    while True:
        writer.write(b"x")
        await writer.drain()
        await anyio.sleep(0.2)


@asynccontextmanager
async def engines(*answers: Answer | None) -> AsyncIterator[list[Engine]]:
    """Engines on loopback; ``None``: a port where nothing listens (connections refused)."""
    made: list[Engine] = []
    servers: list[asyncio.Server] = []
    for answer in answers:
        engine = Engine(answer or ok)
        sock = listening_socket()
        if answer is None:
            engine.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            sock.close()
        else:
            server = await asyncio.start_server(engine.serve, sock=sock)
            servers.append(server)
            engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        made.append(engine)
    try:
        yield made
    finally:
        for server in servers:
            server.close()
        for engine in made:
            for task in engine.tasks:
                task.cancel()


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


@pytest.fixture(scope="module")
async def parser() -> AsyncIterator[ParserPool]:
    config = ParserPoolConfig(workers=2, arena=ArenaConfig(size_bytes=8 << 20, page_bytes=4096))
    async with ParserPool(config) as pool:
        yield pool


Send = Callable[[Router, str], Awaitable[object]]


def sender(transport: str, parser: ParserPool) -> Send:
    async def send(router: Router, rid: str) -> object:
        client = router.client

        async def attempt(url: str) -> object:
            if transport == "aiohttp":
                return await client.post(url, PATH, PAYLOAD, request_id=rid, retry=False)
            request = BlockingRequest.from_config(client.config, url, PATH, PAYLOAD, request_id=rid)
            return await parser.fetch(request, expected_items=1)

        return await router.call(attempt)

    return send


TRANSPORTS = ["aiohttp", "worker"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("answer", "error"),
    [(silent, EngineTimeoutError), (reset, EngineUnavailableError), (stall, EngineTimeoutError)],
    ids=["timeout-after-send", "reset-after-send", "stall"],
)
async def test_a_request_the_engine_received_is_never_sent_again(
    transport: str, answer: Answer, error: type[EngineError], parser: ParserPool
) -> None:
    send = sender(transport, parser)
    async with (
        engines(answer, answer) as (first, second),
        EngineClient(CLIENT) as client,
        Router([first.url, second.url], client, ROUTER) as router,
    ):
        with pytest.raises(error) as caught:
            await send(router, "rid-contract")
        assert caught.value.retryable is False
        assert caught.value.request_id == "rid-contract"
        assert caught.value.url in (first.url, second.url)
        assert first.received + second.received == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("failing", [None, unavailable], ids=["refused", "503"])
async def test_only_never_sent_failures_and_503_are_retried_on_another_engine(
    transport: str, failing: Answer | None, parser: ParserPool
) -> None:
    send = sender(transport, parser)
    async with (
        engines(failing, ok) as (bad, good),
        EngineClient(CLIENT) as client,
        Router([bad.url, good.url], client, ROUTER) as router,
    ):
        for _ in range(4):  # whichever engine the lease picks first
            await send(router, "rid-ok")
        # Every call was served once, by the good engine; a refused connection reached
        # nothing, a 503 was answered at most once per call (round robin picks it first
        # every other call) and the retry went elsewhere.
        assert good.received == 4
        if failing is None:
            assert bad.received == 0
        else:
            assert 1 <= bad.received <= 4


async def test_with_every_engine_down_a_call_fails_once_after_one_wait() -> None:
    # Once no engine is healthy, the lease waits wait_timeout_s and the call ends: "no
    # healthy engine" is not retried (the old default made every attempt wait again).
    config = RouterConfig(
        max_inflight_per_engine=4, health_interval_s=60.0, failure_threshold=1, wait_timeout_s=0.2
    )
    async with (
        engines(None, None) as (a, b),
        EngineClient(CLIENT) as client,
        Router([a.url, b.url], client, config) as router,
    ):
        with pytest.raises(EngineUnavailableError, match="no healthy engine") as caught:
            await router.post_json("/generate", {})
        assert caught.value.retryable is False
        stats = router.statistics()
        assert (stats.waits, stats.wait_timeouts) == (1, 1)
