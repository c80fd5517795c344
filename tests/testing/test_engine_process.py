from __future__ import annotations

import json
import multiprocessing
import socket
import urllib.error
import urllib.request

import aiohttp
import anyio
import anyio.to_thread
import pytest

from miles_lite.testing import EngineProcess, EngineProcessGroup, StandInConfig, StandInError
from tests.support.processes import alive
from tests.testing.replies import get, post


def generate(url: str) -> int:
    request = urllib.request.Request(
        f"{url}/rollout/generate",
        data=json.dumps({"prompt": "x", "seed": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()  # the whole body, or the server may count a reset
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_engine_process_serves_and_stops_cleanly() -> None:
    with EngineProcess(StandInConfig(warmup_s=0.2)) as engine:
        pid = engine.pid
        assert pid is not None and engine.is_alive()
        # start() returned after warm-up: the engine is healthy and generates.
        assert generate(engine.url) == 200
        assert engine.set_faults(status_next=[503])["status_next"] == [503]
        assert generate(engine.url) == 503
        stats = engine.stats()
        assert stats["requests_served"] == 1 and stats["requests_failed"] == 1
        with pytest.raises(urllib.error.HTTPError):
            engine.set_faults(bogus=1)
    assert not engine.is_alive() and not alive(pid)
    assert multiprocessing.active_children() == []
    with pytest.raises(StandInError, match="create a new one"):
        engine.start()


def test_fork_is_refused() -> None:
    with pytest.raises(ValueError, match=r"start_method .*'fork'"):
        EngineProcess(start_method="fork")
    with pytest.raises(ValueError, match=r"start_timeout_s .*0"):
        EngineProcess(start_timeout_s=0)
    with pytest.raises(ValueError, match="configs"):
        EngineProcessGroup([])


@pytest.mark.anyio
async def test_engine_process_group_in_async_code(session: aiohttp.ClientSession) -> None:
    configs = [StandInConfig(), StandInConfig(wire="json")]
    async with EngineProcessGroup(configs) as group:
        pids = [process.pid for process in group.processes]
        assert len(set(group.urls)) == 2
        for url in group.urls:
            assert (await get(session, url, "/health")).status == 200
        reply = await post(session, group.urls[1], {"prompt": "x", "seed": 1})
        assert reply.status == 200 and reply.content_type == "application/json"
        # The child exits by itself when its parent's end of the pipe closes (no orphans).
        orphan = group.processes[0]
        assert orphan._conn is not None and orphan._process is not None
        orphan._conn.close()
        await anyio.to_thread.run_sync(orphan._process.join, 10)
        assert orphan._process.exitcode == 0
    assert all(pid is not None and not alive(pid) for pid in pids)
    assert multiprocessing.active_children() == []


def test_a_failed_start_says_why_and_stopping_after_it_hides_nothing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = EngineProcess(StandInConfig(port=port), start_timeout_s=30)
        with pytest.raises(StandInError, match="exited with code 1 before serving"):
            process.start()
        process.stop()  # no error hiding the start error
        process.stop()  # idempotent
        with (
            pytest.raises(StandInError, match="before serving"),
            EngineProcess(StandInConfig(port=port), start_timeout_s=30),
        ):
            pass
