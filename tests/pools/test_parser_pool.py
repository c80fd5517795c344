from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import anyio
import pytest
import torch
from aiohttp import web

from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.engine.http._errors import Timeouts
from miles_lite.engine.http.blocking import BlockingRequest
from miles_lite.errors import CodecError, EngineProtocolError, EngineStatusError, WorkerCrashedError
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from tests.pools import work
from tests.pools.bodies import CTYPE, body
from tests.support.garbage import collect_garbage
from tests.support.leaks import leaked_shm, shm_entries

pytestmark = pytest.mark.anyio

PAGE = 4096


@pytest.fixture
async def parser() -> AsyncIterator[ParserPool]:
    cfg = ParserPoolConfig(workers=2, arena=ArenaConfig(size_bytes=256 * PAGE, page_bytes=PAGE))
    async with ParserPool(cfg) as p:
        yield p


def assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        for key in ("generated_output", "rollout_log_probs"):
            assert torch.equal(g[key], w[key])
        assert torch.equal(g["dit_trajectory"]["latents"], w["dit_trajectory"]["latents"])
        assert g["dit_trajectory"]["latents"].dtype == torch.bfloat16
        assert g["dit_trajectory"]["sigmas"] is None


@pytest.mark.parametrize("form", ["msgpack", "json"])
async def test_parse_in_place_gives_the_encoded_tensors_aligned(
    parser: ParserPool, form: str
) -> None:
    raw = body(3, form=form)
    lease = await parser.allocate(len(raw))
    lease.view[:] = raw
    parsed = await parser.parse(lease, CTYPE[form])
    del lease
    assert_same(parsed.items, decode_to_tensors(bytearray(body(3)), CTYPE["msgpack"]))
    latents = parsed.items[0]["dit_trajectory"]["latents"]
    assert latents.data_ptr() % 64 == 0
    assert parser.arena is not None and parser.arena.used_bytes > 0
    del parsed, latents
    await collect_garbage()
    assert parser.arena.used_bytes == 0


async def test_a_malformed_body_is_a_codec_error_naming_url_and_request(parser: ParserPool) -> None:
    raw = body(1)[:-10]
    lease = await parser.allocate(len(raw))
    lease.view[:] = raw
    with pytest.raises(CodecError, match=r"truncated.*engine http://e:1, request r-9"):
        await parser.parse(lease, CTYPE["msgpack"], url="http://e:1", request_id="r-9")
    del lease
    await collect_garbage()
    assert parser.arena is not None and parser.arena.used_bytes == 0


class Server:
    def __init__(self) -> None:
        self.mode = "ok"
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        if self.mode == "500":
            return web.json_response({"detail": "seed missing"}, status=500)
        if self.mode == "slow":
            await anyio.sleep(0.5)
        raw = body(payload["seed"])
        if self.mode == "truncate":
            resp = web.StreamResponse(
                headers={"Content-Type": CTYPE["msgpack"], "Content-Length": str(len(raw))}
            )
            await resp.prepare(request)
            await resp.write(raw[: len(raw) // 2])
            request.transport.close()  # type: ignore[union-attr]
            return resp
        return web.Response(body=raw, content_type=CTYPE["msgpack"])


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = Server()
    app = web.Application()
    app.router.add_post("/rollout/generate", srv.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    srv.url = f"http://127.0.0.1:{port}"
    yield srv
    await runner.cleanup()


def fetch(srv: Server, seed: int) -> BlockingRequest:
    return BlockingRequest(
        url=srv.url,
        path="/rollout/generate",
        body=json.dumps({"seed": seed}).encode(),
        request_id=f"r-{seed}",
        timeouts=Timeouts(connect_s=5.0, read_s=None, total_s=5.0),
        max_body_bytes=1 << 20,
    )


async def test_fetch_in_parser_gives_the_same_tensors(parser: ParserPool, server: Server) -> None:
    parsed = await parser.fetch(fetch(server, 5))
    assert parsed.wire_bytes == len(body(5))
    assert parsed.response_at <= parsed.read_at <= parsed.parsed_at
    assert_same(parsed.items, decode_to_tensors(bytearray(body(5)), CTYPE["msgpack"]))


async def test_parser_workers_import_neither_torch_nor_aiohttp(
    parser: ParserPool, server: Server
) -> None:
    # Each fetch_in_parser generation holds a worker, so there are many: one that imported
    # the whole library would cost ~160 MB and a second of start-up instead of ~20 MB.
    await parser.fetch(fetch(server, 4))
    lease = await parser.allocate(len(body(5)))
    lease.view[:] = body(5)
    await parser.parse(lease, CTYPE["msgpack"])
    for index in range(parser.config.workers):
        assert await parser.pool.run_on(index, work.heavy_modules) == []


async def test_fetch_errors_are_typed_and_free_their_space(
    parser: ParserPool, server: Server
) -> None:
    server.mode = "500"
    with pytest.raises(EngineStatusError, match="seed missing") as info:
        await parser.fetch(fetch(server, 1))
    assert (
        info.value.status == 500 and info.value.request_id == "r-1" and info.value.url == server.url
    )
    server.mode = "truncate"
    with pytest.raises(EngineProtocolError, match="truncated"):
        await parser.fetch(fetch(server, 2))
    assert parser.arena is not None and parser.arena.used_bytes == 0
    server.mode = "ok"
    assert len((await parser.fetch(fetch(server, 3))).items) == 2


async def test_cancelled_fetch_frees_the_late_answer(parser: ParserPool, server: Server) -> None:
    server.mode = "slow"
    with anyio.move_on_after(0.1):
        await parser.fetch(fetch(server, 4))
    await anyio.sleep(0.8)
    assert parser.arena is not None and parser.arena.used_bytes == 0


async def test_killed_worker_pages_are_reclaimed_and_nothing_leaks(server: Server) -> None:
    shm_before = shm_entries()
    cfg = ParserPoolConfig(workers=1, arena=ArenaConfig(size_bytes=64 * PAGE, page_bytes=PAGE))
    async with ParserPool(cfg) as parser:
        assert parser.arena is not None
        worker_pid = await parser.pool.run(os.getpid)
        # A worker killed while it holds arena pages: they come back with its replacement.
        parser.arena._table.try_alloc(5, 2)
        os.kill(worker_pid, 9)
        with pytest.raises(WorkerCrashedError):
            await parser.fetch(fetch(server, 6))
        assert parser.arena.used_bytes == 0
        assert len((await parser.fetch(fetch(server, 7))).items) == 2
    assert leaked_shm(shm_before) == set()  # only what this test left counts
