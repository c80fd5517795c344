"""Router.wait_ready tells "nothing listens there" from "not serving yet": within the short
default wait a refused connection is final (one probe, not a 5 s loop); a longer wait,
given for engines still loading weights, probes a refusing engine again until it serves."""

from __future__ import annotations

import anyio
import pytest
from aiohttp import web

from miles_lite.engine.config import RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import EngineNotReadyError, EngineUnavailableError
from tests.support.engine_fakes import Reply, ScriptedEngine, listening_socket, start_engine
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio

#: Health rounds so far apart that only wait_ready probes during a test.
CONFIG = RouterConfig(max_inflight_per_engine=4, health_interval_s=30.0, health_timeout_s=1.0)


async def test_a_refused_connection_ends_the_default_wait_after_one_probe(
    client: EngineClient,
) -> None:
    # A bound socket that does not listen refuses connections: nothing listens there.
    with listening_socket() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with Router([url], client, CONFIG) as router:
            with pytest.raises(EngineNotReadyError) as caught:
                await router.wait_ready()  # RouterConfig's default wait: 5 s
    error = caught.value
    assert isinstance(error, EngineUnavailableError)
    assert (error.urls, error.refused, error.timeout_s) == ((url,), (url,), 5.0)
    assert f"nothing listens at {url} (connection refused" in str(error)
    assert "RouterConfig(ready_timeout_s=600)" in str(error)
    # One /health probe (and the health loop's first round), not one every 0.25 s for the
    # whole 5 s (about 20).
    assert client.statistics().requests <= 2


async def test_a_long_wait_probes_a_refusing_engine_until_it_serves(client: EngineClient) -> None:
    engine = ScriptedEngine()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    ready: list[tuple[str, ...]] = []
    try:
        async with Router([url], client, CONFIG) as router, anyio.create_task_group() as tg:

            async def wait() -> None:
                ready.append(await router.wait_ready(30.0))

            tg.start_soon(wait)
            # Refused twice: the loading engine is probed again, not given up on.
            await wait_until(lambda: client.statistics().failures >= 2)
            assert not ready
            await web.SockSite(runner, sock).start()  # the engine starts listening
    finally:
        await runner.cleanup()
        sock.close()
    assert ready == [(url,)] and engine.count("/health") == 1


async def test_an_engine_that_listens_but_is_not_ready_is_waited_for_then_named(
    client: EngineClient,
) -> None:
    engine = ScriptedEngine()
    engine.defaults["/health"] = Reply(503)  # starting: it listens, but is not ready
    runner = await start_engine(engine)
    try:
        async with Router([engine.url], client, CONFIG) as router:
            with pytest.raises(EngineNotReadyError) as caught:
                await router.wait_ready(0.8)
    finally:
        await runner.cleanup()
    error = caught.value
    assert error.urls == (engine.url,) and error.refused == ()
    assert f"no answer to /health within 0.8 s from {engine.url}" in str(error)
    assert engine.count("/health") >= 2  # probed again while the wait lasted
