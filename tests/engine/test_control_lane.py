"""Control calls have connections of their own: generations holding every pooled
connection to an engine (a ``retract`` or ``in_place`` pause keeps them open until the
weight update is done) never hold up a pause, a weight load, a version read, an abort or a
health probe. Before, a control call queued behind them for a connection: a weight update
with more generations in flight than ``max_connections_per_host`` waited until the
update's own timeout (300 s), then failed."""

from __future__ import annotations

import json

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http.client import EngineClient
from miles_lite.errors import ConfigError
from tests.support.engine_fakes import Reply, ScriptedEngine
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio

OK = Reply(200, json.dumps({"status": "ok"}).encode(), "application/json")
#: A generation the engine holds far longer than the test runs (as a pause holds it).
HELD = Reply(200, b"{}", "application/json", delay_s=60.0)


async def test_control_calls_reach_an_engine_whose_every_connection_a_generation_holds(
    engine: ScriptedEngine,
) -> None:
    engine.script("/generate", *[HELD] * 6)
    engine.script("/pause_generation", OK)
    engine.script("/abort_request", OK)
    config = EngineClientConfig(
        max_connections=8,
        max_connections_per_host=2,
        control_connections_per_host=2,
        retry=RetryPolicy(max_attempts=1),
    )
    async with EngineClient(config) as client, anyio.create_task_group() as generations:
        for _ in range(6):  # 2 at the engine, 4 waiting in the pool for a connection
            generations.start_soon(client.post_json, engine.url, "/generate", {})
        await wait_until(lambda: engine.count("/generate") == 2)
        # Each bounded far below the held generations: queued behind them, it times out.
        paused = await client.post_json(
            engine.url, "/pause_generation", {"mode": "retract"}, timeout_s=10, control=True
        )
        aborted = await client.post_json(
            engine.url, "/abort_request", {"abort_all": True}, timeout_s=10, control=True
        )
        healthy = await client.health(engine.url, timeout_s=10)
        # The generations still hold their connections and wait for theirs.
        assert engine.count("/generate") == 2
        generations.cancel_scope.cancel()
    assert paused == {"status": "ok"} and aborted == {"status": "ok"} and healthy


async def test_a_control_connection_is_kept_for_the_next_control_call(
    engine: ScriptedEngine,
) -> None:
    config = EngineClientConfig(control_connections_per_host=1, retry=RetryPolicy(max_attempts=1))
    async with EngineClient(config) as client:
        for _ in range(3):
            assert await client.health(engine.url, timeout_s=10)
    ports = {seen.client_port for seen in engine.seen if seen.path == "/health"}
    assert len(ports) == 1, ports  # one connection, reused


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, None])
def test_a_bad_control_connection_count_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError, match="control_connections_per_host"):
        EngineClientConfig(control_connections_per_host=bad)  # type: ignore[arg-type]
