"""Faults of fetch_in_parser against a misbehaving raw-socket engine on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
import torch
from anyio.abc import SocketStream

from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.engine.http._errors import Timeouts
from miles_lite.engine.http.blocking import BlockingRequest
from miles_lite.errors import ConfigError, EngineProtocolError, EngineTimeoutError
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from tests.pools.bodies import CTYPE, body

pytestmark = pytest.mark.anyio

PAGE = 4096


def answer(raw: bytes, *, status: str = "200 OK", ctype: str = CTYPE["msgpack"]) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(raw)}\r\n\r\n"
    return head.encode() + raw


async def read_request(stream: SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += await stream.receive()
    return rest


Handler = Callable[[SocketStream, int], "anyio.abc.TaskStatus[None] | None"]


@pytest.fixture
async def parser() -> AsyncIterator[ParserPool]:
    cfg = ParserPoolConfig(workers=1, arena=ArenaConfig(size_bytes=256 * PAGE, page_bytes=PAGE))
    async with ParserPool(cfg) as p:
        yield p


async def serve(handler, task_group) -> str:  # type: ignore[no-untyped-def]
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def run() -> None:
        async with listener:
            await listener.serve(handler)

    task_group.start_soon(run)
    return f"http://127.0.0.1:{port}"


def request(
    url: str, seed: int, *, timeout_s: float = 5.0, read_timeout_s: float | None = None
) -> BlockingRequest:
    return BlockingRequest(
        url=url,
        path="/rollout/generate",
        body=json.dumps({"seed": seed}).encode(),
        request_id=f"r-{seed}",
        timeouts=Timeouts(connect_s=5.0, read_s=read_timeout_s, total_s=timeout_s),
        max_body_bytes=1 << 20,
    )


async def test_bytes_past_content_length_are_never_read_as_the_next_answer(
    parser: ParserPool,
) -> None:
    async def handler(stream: SocketStream) -> None:
        async with stream:
            while True:
                try:
                    seed = int((await read_request(stream)).split(b":")[1].strip(b" }"))
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                # The right answer, then a forged one nobody asked for.
                await stream.send(answer(body(seed)) + answer(body(99)))

    async with anyio.create_task_group() as tg:
        url = await serve(handler, tg)
        first = await parser.fetch(request(url, 1))
        await anyio.sleep(0.1)  # the forged answer is in the socket by now
        second = await parser.fetch(request(url, 2))
        want = decode_to_tensors(bytearray(body(2)), CTYPE["msgpack"])
        assert torch.equal(second.items[0]["generated_output"], want[0]["generated_output"])
        assert len(first.items) == 2
        tg.cancel_scope.cancel()


async def test_an_answer_with_another_sample_count_is_refused(parser: ParserPool) -> None:
    async def handler(stream: SocketStream) -> None:
        async with stream:
            await read_request(stream)
            await stream.send(answer(body(1, n=3)))

    async with anyio.create_task_group() as tg:
        url = await serve(handler, tg)
        with pytest.raises(EngineProtocolError, match=r"3 samples.*asked for 2"):
            await parser.fetch(request(url, 1), expected_items=2)
        assert parser.arena is not None and parser.arena.used_bytes == 0
        tg.cancel_scope.cancel()


async def test_a_trickling_engine_is_cut_off_at_the_total_deadline(parser: ParserPool) -> None:
    async def handler(stream: SocketStream) -> None:
        async with stream:
            await read_request(stream)
            data = answer(body(1))
            for i in range(len(data)):
                await stream.send(data[i : i + 1])
                await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        url = await serve(handler, tg)
        start = time.monotonic()
        with pytest.raises(EngineTimeoutError, match=r"within 1\.0 s"):
            await parser.fetch(request(url, 1, timeout_s=1.0, read_timeout_s=0.5))
        assert time.monotonic() - start < 3.0
        tg.cancel_scope.cancel()


async def test_every_2xx_is_accepted_and_a_bad_content_type_spoils_no_later_answer(
    parser: ParserPool,
) -> None:
    count = 0

    async def handler(stream: SocketStream) -> None:
        nonlocal count
        async with stream:
            while True:
                try:
                    await read_request(stream)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                count += 1
                if count == 1:
                    await stream.send(answer(body(1), status="201 Created"))
                elif count == 2:
                    # Unexpected content type, with its body left unread by the worker.
                    await stream.send(answer(b"x" * 100, ctype="text/html"))
                else:
                    await stream.send(answer(body(3)))

    async with anyio.create_task_group() as tg:
        url = await serve(handler, tg)
        assert len((await parser.fetch(request(url, 1))).items) == 2
        with pytest.raises(Exception, match="text/html"):
            await parser.fetch(request(url, 2))
        assert len((await parser.fetch(request(url, 3))).items) == 2
        tg.cancel_scope.cancel()


def test_https_is_refused_when_the_request_is_built() -> None:
    with pytest.raises(ConfigError, match="https://e:1"):
        request("https://e:1", 1)
