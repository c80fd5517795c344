"""Pooled connections are dropped before SGLang's server drops them (issue 33's chaos
tier): uvicorn closes an idle keep-alive connection after 5 s, and a request sent on it
at that moment is lost. A real loopback server counts the connections it accepted."""

from __future__ import annotations

import anyio
import pytest
from aiohttp import web

from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.http.aiohttp_transport import KEEPALIVE_S
from miles_lite.engine.http.client import EngineClient

pytestmark = pytest.mark.anyio

#: uvicorn's default timeout_keep_alive, SGLang's HTTP server's.
UVICORN_KEEPALIVE_S = 5.0


async def test_an_idle_connection_is_not_reused_past_the_keepalive() -> None:
    assert KEEPALIVE_S < UVICORN_KEEPALIVE_S
    peers: list[object] = []

    async def health(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, keepalive_timeout=60.0)  # the server keeps it: ours drops it
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}"
        async with EngineClient(EngineClientConfig()) as client:
            assert await client.health(url)
            assert await client.health(url)  # at once: the pooled connection
            await anyio.sleep(KEEPALIVE_S + 1.0)
            assert await client.health(url)  # idle past the keep-alive: a new one
        assert len(peers) == 3 and peers[0] == peers[1] != peers[2], peers
    finally:
        await runner.cleanup()
