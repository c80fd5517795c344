from __future__ import annotations

import contextlib

import aiohttp
import anyio
import pytest

from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.errors import CodecError
from miles_lite.testing import StandInEngine
from tests.testing.replies import Reply, get, post

pytestmark = pytest.mark.anyio

BODY = {"prompt": "x", "seed": 3}


async def test_drop_connection_closes_without_answer(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.drop_connection_next = 1
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(session, engine.url, BODY)
        assert (await post(session, engine.url, BODY)).status == 200
        assert engine.stats.requests_failed == 1 and engine.stats.requests_served == 1


async def test_truncated_body_announces_more_than_it_sends(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.truncate_body_next = 1
        with pytest.raises(aiohttp.ClientPayloadError):
            await post(session, engine.url, BODY)
        assert engine.faults.truncate_body_next == 0
        assert (await post(session, engine.url, BODY)).status == 200


async def test_stall_hangs_until_the_client_gives_up(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.stall_next = 1
        with pytest.raises(TimeoutError):
            async with session.post(
                engine.url + "/rollout/generate",
                json=BODY,
                timeout=aiohttp.ClientTimeout(total=0.2),
            ) as response:
                await response.read()
        engine.faults.stall_next, engine.faults.stall_s = 1, 0.01
        assert (await post(session, engine.url, BODY)).status == 200  # a short stall then goes on


async def test_status_next_answers_each_status_in_turn(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.status_next = [503, 500]
        statuses = [(await post(session, engine.url, BODY)).status for _ in range(3)]
        assert statuses == [503, 500, 200]
        assert engine.stats.requests_received == 3 and engine.stats.max_generations_in_flight == 1


async def test_corrupt_body_does_not_decode(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.corrupt_body_next = 1
        reply = await post(session, engine.url, BODY)
    assert reply.status == 200 and reply.content_type == "application/msgpack"
    with pytest.raises(CodecError):
        decode_to_tensors(bytearray(reply.body), reply.content_type)


async def test_unhealthy_fails_health_checks(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        engine.faults.unhealthy = True
        assert (await get(session, engine.url, "/health")).status == 503
        engine.faults.unhealthy = False
        assert (await get(session, engine.url, "/health_generate")).status == 200


async def test_faults_and_stats_over_http(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        set_reply = await post(
            session, engine.url, {"status_next": [502], "stall_s": 1.5}, path="/_stand_in/faults"
        )
        assert set_reply.status == 200 and set_reply.json()["status_next"] == [502]
        assert engine.faults.stall_s == 1.5
        assert (await post(session, engine.url, BODY)).status == 502
        bad: Reply = await post(
            session, engine.url, {"drop_everything": 1}, path="/_stand_in/faults"
        )
        assert bad.status == 400 and "drop_everything" in bad.json()["detail"]
        current = (await get(session, engine.url, "/_stand_in/faults")).json()
        assert current["status_next"] == []
        stats = (await get(session, engine.url, "/_stand_in/stats")).json()
        assert stats["requests_failed"] == 1 and stats["requests"] == [BODY]
        reset = await post(session, engine.url, {}, path="/_stand_in/stats/reset")
        assert (
            reset.json()["requests_received"] == 0
            and engine.stats.requests == type(engine.stats.requests)()
        )


async def test_aclose_ends_a_stall_promptly(session: aiohttp.ClientSession) -> None:
    engine = StandInEngine()
    await engine.start()
    engine.faults.stall_next = 1

    async def stalled() -> None:
        with contextlib.suppress(aiohttp.ClientError):
            await post(session, engine.url, BODY)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stalled)
        with anyio.fail_after(10):
            await engine.wait_stats(lambda stats: stats.requests_received == 1)
            await engine.aclose()
