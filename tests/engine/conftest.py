"""Fixtures of the engine tests: test-only servers on 127.0.0.1 (tests.support.engine_fakes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http.client import EngineClient
from tests.support.engine_fakes import (
    RawEngine,
    RawHandler,
    ScriptedEngine,
    listening_socket,
    start_engine,
)


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    """An engine client that tries once and gives a call 2 s in all."""
    config = EngineClientConfig(total_timeout_s=2.0, retry=RetryPolicy(max_attempts=1))
    async with EngineClient(config) as engine_client:
        yield engine_client


@pytest.fixture
async def engine() -> AsyncIterator[ScriptedEngine]:
    """A running :class:`ScriptedEngine`."""
    scripted = ScriptedEngine()
    runner = await start_engine(scripted)
    try:
        yield scripted
    finally:
        await runner.cleanup()


@pytest.fixture
async def raw_engine() -> AsyncIterator[Callable[[RawHandler], Awaitable[RawEngine]]]:
    """Start a :class:`RawEngine` with a given answer; stopped at the end of the test."""
    started: list[tuple[asyncio.Server, RawEngine]] = []

    async def start(answer: RawHandler) -> RawEngine:
        raw = RawEngine(answer)
        server = await asyncio.start_server(raw.serve, sock=listening_socket())
        started.append((server, raw))
        raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return raw

    yield start
    for server, raw in started:
        server.close()
        for task in raw.tasks:
            task.cancel()
        await asyncio.gather(*raw.tasks, return_exceptions=True)


@pytest.fixture
def refused_url() -> str:
    """A URL of 127.0.0.1 where nothing listens (connections are refused)."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
