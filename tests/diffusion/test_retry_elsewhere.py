"""A retry asks the router again, avoiding the engine that just failed (issue 11 fault)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.pools.parser_pool import ParserPool
from miles_lite.testing import StandInConfig, StandInEngine
from miles_lite.types import SampleStatus

pytestmark = pytest.mark.anyio


@pytest.fixture
def dead_url() -> Iterator[str]:
    """An engine that died: its port refuses connections."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    yield f"http://127.0.0.1:{port}"


# Connections refused by the dead engine, in asyncio's debug mode, make single loop steps
# of 0.6-0.9 s on this machine (in the test harness, not the library: blockbuster still
# watches for blocking calls).
@pytest.mark.slow_steps_ok
@pytest.mark.parametrize("transport", ["inline", "pool-fetch"])
async def test_with_one_of_two_engines_dead_no_sample_is_lost(
    dead_url: str, transport: str, parser: ParserPool
) -> None:
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=4,
        microgroup_size=2,
        sampling=DiffusionSamplingParams(num_inference_steps=2),
        transport="inline" if transport == "inline" else "pool",
        fetch_in_parser=transport == "pool-fetch",
        # Health probes far apart: the dead engine stays in rotation, so leases keep
        # landing on it and only the retries can save those samples.
        engines=EngineConfig(
            router=RouterConfig(
                max_inflight_per_engine=4, health_interval_s=60.0, failure_threshold=100
            ),
            client=EngineClientConfig(
                retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)
            ),
        ),
    )
    async with (
        StandInEngine(StandInConfig()) as live,
        DiffusionRollout.open([dead_url, live.url], config=config) as rollout,
    ):
        result = await rollout.run([f"prompt {i}" for i in range(6)])
    assert len(result.samples) == 24
    assert all(s.status is SampleStatus.COMPLETED for s in result.samples), [
        str(s.error) for s in result.failed
    ]
    assert all(span.engine == live.url for span in result.spans)
    assert any(span.requests > 1 for span in result.spans)  # some went to the dead one first


async def test_the_dead_engine_is_still_used_when_it_is_the_only_one(dead_url: str) -> None:
    retry = RetryPolicy(max_attempts=2, backoff_initial_s=0.001, backoff_max_s=0.001)
    async with (
        EngineClient(EngineClientConfig(retry=retry)) as client,
        Router(
            [dead_url], client, RouterConfig(max_inflight_per_engine=4, failure_threshold=100)
        ) as router,
    ):
        tried: list[str] = []

        async def post(url: str) -> None:
            tried.append(url)
            await client.post(url, "/generate", {}, retry=False)

        with pytest.raises(Exception, match="cannot reach"):
            await router.call(post)
    assert tried == [dead_url, dead_url]
