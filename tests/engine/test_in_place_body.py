"""Large bodies received by the socket straight into the caller's buffer (recv_into).

Against real servers on 127.0.0.1: the bytes, the counters (bodies taken in place, the
connections the server saw), and every way such a read can end early (a short body, a
stall past the read timeout, a trickle past the total timeout, a cancelled caller), after
which nothing more is written into the buffer and the client goes on working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http import in_place
from miles_lite.engine.http.aiohttp_transport import IN_PLACE_MIN_BYTES, AiohttpTransport
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.response import FreshBuffer
from miles_lite.errors import EngineProtocolError, EngineTimeoutError
from tests.support.engine_fakes import RawEngine, RawHandler, Reply, ScriptedEngine

pytestmark = pytest.mark.anyio

StartRaw = Callable[[RawHandler], Awaitable[RawEngine]]
BIG = IN_PLACE_MIN_BYTES * 3


def pattern(nbytes: int) -> bytes:
    return (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]


def client(**overrides: object) -> tuple[EngineClient, AiohttpTransport]:
    fields: dict[str, object] = {"retry": RetryPolicy(max_attempts=3), "total_timeout_s": 30.0}
    fields.update(overrides)
    config = EngineClientConfig(**fields)  # type: ignore[arg-type]
    transport = AiohttpTransport(config)
    return EngineClient(config, transport=transport), transport


class Buffers:
    """Hands out zeroed bytearrays and keeps them, to look at after the read."""

    def __init__(self) -> None:
        self.buffers: list[bytearray] = []

    async def __call__(self, nbytes: int) -> FreshBuffer:
        self.buffers.append(bytearray(nbytes))
        return FreshBuffer(self.buffers[-1])


async def test_a_large_body_is_received_in_place_and_its_connection_not_reused(
    engine: ScriptedEngine,
) -> None:
    body = pattern(BIG)
    small = pattern(IN_PLACE_MIN_BYTES // 2)
    engine.script(
        "/rollout/generate",
        Reply(body=body, pieces=12),
        Reply(body=body, pieces=12),
        Reply(body=small),
        Reply(body=small),
    )
    into = Buffers()
    engine_client, transport = client()
    async with engine_client:
        for _ in range(4):
            raw = await engine_client.post(engine.url, "/rollout/generate", {}, into=into)
            assert raw.body == (body if len(raw.body) == BIG else small)
            assert raw.body.obj is into.buffers[-1]  # the caller's buffer, not a copy
        assert engine_client.statistics().bytes_received == 2 * BIG + 2 * len(small)
    assert transport.bodies_in_place == 2
    ports = [seen.client_port for seen in engine.seen]
    # Each large body's connection was closed after it; the small ones share one.
    assert ports[0] != ports[1] and ports[1] != ports[2] and ports[2] == ports[3]


async def _short_big_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n".encode())
    writer.write(bytes(BIG // 2))
    await writer.drain()


async def test_a_short_large_body_is_a_truncated_error_never_resent(raw_engine: StartRaw) -> None:
    raw = await raw_engine(_short_big_body)
    engine_client, transport = client()
    async with engine_client:
        with pytest.raises(EngineProtocolError, match=f"got {BIG // 2} of {BIG} bytes") as caught:
            await engine_client.post(raw.url, "/rollout/generate", {}, request_id="short")
    assert transport.bodies_in_place == 1
    assert raw.connections == 1 and not caught.value.retryable


def _stalling(sent: int, then: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> RawHandler:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n".encode())
        writer.write(b"\x01" * sent)
        await writer.drain()
        await then(writer)

    return answer


async def _silence(writer: asyncio.StreamWriter) -> None:
    await anyio.sleep(30)


async def _trickle(writer: asyncio.StreamWriter) -> None:
    for _ in range(3000):
        await anyio.sleep(0.01)
        writer.write(b"\x01")
        await writer.drain()


async def test_a_stall_mid_body_is_a_read_timeout(raw_engine: StartRaw) -> None:
    raw = await raw_engine(_stalling(BIG // 2, _silence))
    engine_client, transport = client(read_timeout_s=0.3)
    async with engine_client:
        with pytest.raises(EngineTimeoutError, match="read_timeout_s") as caught:
            await engine_client.post(raw.url, "/rollout/generate", {}, request_id="stall")
    assert transport.bodies_in_place == 1 and raw.connections == 1
    assert f"after {BIG // 2} body bytes" in str(caught.value) and not caught.value.retryable


async def test_a_trickle_mid_body_is_a_total_timeout(raw_engine: StartRaw) -> None:
    raw = await raw_engine(_stalling(BIG // 2, _trickle))
    engine_client, transport = client(read_timeout_s=5.0, total_timeout_s=0.6)
    async with engine_client:
        with pytest.raises(EngineTimeoutError, match="total timeout") as caught:
            await engine_client.post(raw.url, "/rollout/generate", {}, request_id="slow")
    assert transport.bodies_in_place == 1 and raw.connections == 1
    assert not caught.value.retryable


async def test_a_cancelled_read_closes_its_connection_and_writes_nothing_after(
    raw_engine: StartRaw, engine: ScriptedEngine
) -> None:
    client_closed = anyio.Event()

    async def half_then_wait(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n".encode())
        writer.write(b"\x01" * (BIG // 2))
        await writer.drain()
        assert await reader.read() == b""  # the client closed its end
        client_closed.set()

    raw = await raw_engine(half_then_wait)
    into = Buffers()
    engine_client, transport = client()
    async with engine_client:
        with anyio.move_on_after(0.5) as scope:
            await engine_client.post(raw.url, "/rollout/generate", {}, into=into)
        assert scope.cancelled_caught and transport.bodies_in_place == 1
        with anyio.fail_after(5):
            await client_closed.wait()
        buffer = into.buffers[0]
        got = len(buffer) - len(buffer.lstrip(b"\x01"))
        assert 0 < got <= BIG // 2 and buffer.count(0) == BIG - got
        # The client goes on: the next large body arrives whole.
        body = pattern(BIG)
        engine.script("/rollout/generate", Reply(body=body, pieces=3))
        answer = await engine_client.post(engine.url, "/rollout/generate", {}, into=into)
        assert answer.body == body and transport.bodies_in_place == 2


async def test_each_socket_read_takes_at_most_read_chunk_bytes(
    engine: ScriptedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = in_place.InPlaceBody.buffer_updated

    def counted(self: in_place.InPlaceBody, nbytes: int) -> None:
        reads.append(nbytes)
        real(self, nbytes)

    monkeypatch.setattr(in_place.InPlaceBody, "buffer_updated", counted)
    body = pattern(BIG)
    engine.script("/rollout/generate", Reply(body=body, pieces=2))
    engine_client, transport = client(read_chunk_bytes=64 << 10)
    async with engine_client:
        raw = await engine_client.post(engine.url, "/rollout/generate", {})
    assert raw.body == body and transport.bodies_in_place == 1
    assert max(reads) <= 64 << 10 and sum(reads) > BIG // 2  # most of it came in place
