"""EngineClient.post(on_chunk=...): a streamed answer's pieces reach the caller as they
arrive (the server waits for the caller to have seen the first before it sends the rest),
and the body still comes back whole; an answer with a Content-Length is read in pieces
too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import pytest
from aiohttp import web

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http.client import EngineClient

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Server:
    def __init__(self) -> None:
        self.seen_first = asyncio.Event()
        self.url = ""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await self.seen_first.wait()  # only once the caller saw the first piece
        await response.write(b"data: 2\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def whole(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000, content_type="application/json")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    served = Server()
    app = web.Application()
    app.router.add_post("/stream", served.stream)
    app.router.add_post("/whole", served.whole)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    served.url = f"http://127.0.0.1:{port}"
    try:
        yield served
    finally:
        await runner.cleanup()


async def test_pieces_reach_the_caller_as_they_arrive(server: Server) -> None:
    pieces: list[bytes] = []

    def on_chunk(piece: bytes) -> None:
        pieces.append(piece)
        if b"data: 1" in b"".join(pieces):
            server.seen_first.set()

    config = EngineClientConfig(retry=RetryPolicy(max_attempts=1))
    async with EngineClient(config) as client:
        # A client that handed pieces over only at the end would wait here forever.
        with anyio.fail_after(30):
            raw = await client.post(server.url, "/stream", {}, retry=False, on_chunk=on_chunk)
    body = bytes(raw.body)
    assert body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert b"".join(pieces) == body and len(pieces) >= 2


async def test_a_body_with_content_length_is_read_in_pieces_too(server: Server) -> None:
    pieces: list[bytes] = []
    config = EngineClientConfig(retry=RetryPolicy(max_attempts=1), read_chunk_bytes=1024)
    async with EngineClient(config) as client:
        raw = await client.post(server.url, "/whole", {}, on_chunk=pieces.append)
    assert bytes(raw.body) == b"x" * 5000 == b"".join(pieces)
    assert len(pieces) >= 2
