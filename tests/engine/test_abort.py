"""Abort fan-out: /abort_request per rid, then /v1/loads until idle, bounded per engine."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.control import abort_requests, busy_requests
from miles_lite.engine.http.client import EngineClient
from tests.support.engine_fakes import Reply, ScriptedEngine, start_engine

pytestmark = pytest.mark.anyio

JSON = "application/json"


def loads(*ranks: tuple[int, int]) -> bytes:
    """A /v1/loads answer in SGLang 0.5.23's shape: one entry per data-parallel rank."""
    return json.dumps(
        {
            "timestamp": "2026-12-03T07:00:00",
            "version": "0.5.23",
            "loads": [
                {"dp_rank": i, "num_running_reqs": r, "num_waiting_reqs": w}
                for i, (r, w) in enumerate(ranks)
            ],
        }
    ).encode()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ScriptedEngine, ScriptedEngine]]:
    engines = (ScriptedEngine(), ScriptedEngine())
    runners = [await start_engine(engine) for engine in engines]
    try:
        yield engines
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    async with EngineClient(EngineClientConfig()) as engine_client:
        yield engine_client


def test_busy_requests_reads_the_real_shape_and_refuses_others() -> None:
    assert busy_requests(json.loads(loads((2, 1), (0, 3)))) == 6
    assert busy_requests(json.loads(loads((0, 0)))) == 0
    assert busy_requests({"num_running_reqs": 0}) is None  # not the 0.5.23 shape
    assert busy_requests({"loads": [{"dp_rank": 0, "num_running_reqs": 1}]}) is None
    assert busy_requests([]) is None


async def test_each_rid_is_aborted_then_loads_polled_until_idle(
    pair: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    a, b = pair
    for engine in pair:
        engine.defaults["/abort_request"] = Reply(200)
        engine.defaults["/v1/loads"] = Reply(200, loads((0, 0)), JSON)
    a.script("/v1/loads", Reply(200, loads((1, 1)), JSON), Reply(200, loads((1, 0)), JSON))
    report = await abort_requests(
        client, {a.url: ["rid-a1", "rid-a2"], b.url: ["rid-b1"]}, poll_interval_s=0.01
    )
    assert report.idle
    assert [(e.url, e.rids_sent > 0, e.idle, e.error) for e in report.engines] == [
        (a.url, True, True, None),
        (b.url, True, True, None),
    ]
    sent_a = {json.loads(s.body)["rid"] for s in a.seen if s.path == "/abort_request"}
    sent_b = [json.loads(s.body) for s in b.seen if s.path == "/abort_request"]
    assert sent_a == {"rid-a1", "rid-a2"} and sent_b == [{"rid": "rid-b1"}]
    assert a.count("/v1/loads") == 3  # busy, busy, idle


async def test_abort_all_sends_one_request(
    pair: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    a, _ = pair
    a.defaults["/abort_request"] = Reply(200)
    a.defaults["/v1/loads"] = Reply(200, loads((0, 0)), JSON)
    report = await abort_requests(client, {a.url: []}, abort_all=True)
    assert report.idle
    assert [json.loads(s.body) for s in a.seen if s.path == "/abort_request"] == [
        {"abort_all": True}
    ]


async def test_an_engine_that_never_answers_does_not_stall_the_others(
    pair: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    hung, well = pair
    hung.defaults["/abort_request"] = Reply(200, delay_s=30.0)
    hung.defaults["/v1/loads"] = Reply(200, loads((0, 0)), JSON, delay_s=30.0)
    well.defaults["/abort_request"] = Reply(200)
    well.defaults["/v1/loads"] = Reply(200, loads((0, 0)), JSON)
    started = time.monotonic()
    report = await abort_requests(
        client, {hung.url: ["r1"], well.url: ["r2"]}, timeout_s=0.2, settle_timeout_s=1.0
    )
    assert time.monotonic() - started < 5.0  # the bound, not 30 s
    by_url = {e.url: e for e in report.engines}
    assert by_url[well.url].idle and by_url[well.url].error is None
    assert not by_url[hung.url].idle and by_url[hung.url].error
    assert not report.idle


async def test_an_engine_without_loads_is_reported_not_waited_for(
    pair: tuple[ScriptedEngine, ScriptedEngine], client: EngineClient
) -> None:
    old, _ = pair
    old.defaults["/abort_request"] = Reply(200)  # /v1/loads: 404 (an older engine)
    report = await abort_requests(client, {old.url: ["r1"]}, settle_timeout_s=5.0)
    (only,) = report.engines
    assert not only.idle and only.error is not None and "idle" in only.error
    assert only.elapsed_s < 2.0
