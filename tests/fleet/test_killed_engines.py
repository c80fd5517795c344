"""Real deaths (issue 33 item 1 and case 6): a stand-in engine in a child process is
SIGKILLed mid-rollout, or during a weight update, and restarted on its port with its
launch weights. It serves again only after the fleet caught it up (its own request log:
the version ``/model_info`` reported as each request arrived); every sample given comes
back exactly once; no rid reaches two engines."""

from __future__ import annotations

import dataclasses
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy
from miles_lite.errors import EngineControlError, EngineError
from miles_lite.rollout.result import RolloutResult
from miles_lite.testing import TextPolicy, TextStandInConfig
from miles_lite.testing.text.process import TextEngineProcess, TextEngineProcessGroup
from tests.support.polling import wait_until

from .conftest import FAST_ROUTER, check_exactly_once, check_none_failed

pytestmark = pytest.mark.anyio

CONFIG = TextStandInConfig(token_latency_s=0.02, policy=TextPolicy(default_length=30))
SETTINGS = TextRolloutConfig(
    sampling=TextSamplingParams(max_new_tokens=30, extra={"ignore_eos": True}),
    engines=EngineConfig(
        router=FAST_ROUTER,
        client=EngineClientConfig(read_timeout_s=30.0, retry=RetryPolicy(max_attempts=2)),
    ),
)


def rids(stats: dict[str, Any]) -> set[str]:
    return {str(body.get("rid")) for body in stats["requests"]}


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def stats_of(*engines: TextEngineProcess) -> list[dict[str, Any]]:
    return await anyio.to_thread.run_sync(lambda: [e.stats() for e in engines])


async def reports(engine: TextEngineProcess, version: str, timeout_s: float = 20.0) -> None:
    """Wait until ``engine`` reports weight ``version`` (its stats, read off the loop)."""
    with anyio.fail_after(timeout_s):
        while True:
            stats = await anyio.to_thread.run_sync(engine.stats)
            if stats["weight_version"] == version:
                return
            await anyio.sleep(0.02)


def failures_name(result: RolloutResult, url: str) -> int:
    """How many samples failed; each with a typed engine error naming ``url``."""
    failed = [s for part in (result.groups, result.partial) for g in part for s in g if s.error]
    for sample in failed:
        assert isinstance(sample.error, EngineError) and sample.error.url == url, sample.error
    return len(failed)


async def test_an_engine_sigkilled_mid_rollout_and_restarted_serves_only_after_catch_up(
    tokenizer: Any, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        group = await stack.enter_async_context(TextEngineProcessGroup([CONFIG, CONFIG]))
        a, b = group.processes
        rollout = await stack.enter_async_context(
            TextRollout.open(group.urls, tokenizer=tokenizer, config=SETTINGS)
        )
        router = rollout.router
        await rollout.update_weights(tmp_path, version="1")  # both take it
        results: list[RolloutResult] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await rollout.run(["Count with me:"] * 24))

            tg.start_soon(run)
            await wait_until(lambda: router.in_flight(b.url) > 0)
            await anyio.sleep(0.1)  # its requests reached it
            assert b.pid is not None
            os.kill(b.pid, signal.SIGKILL)
            await wait_until(lambda: b.url not in router.healthy_urls)
            # Restarted by its supervisor on its port, with its launch weights.
            restarted = TextEngineProcess(dataclasses.replace(CONFIG, port=port_of(b.url)))
            await stack.enter_async_context(restarted)
            assert restarted.url == b.url
            await wait_until(lambda: b.url in router.healthy_urls, timeout_s=30.0)
        first = results[0]
        check_exactly_once(first, groups=24, per_group=4)
        assert failures_name(first, b.url) >= 1  # what it held when it died
        second = await rollout.run(["Count with me:"] * 8)
        check_none_failed(second, groups=8, per_group=4)
        stats_a, stats_b = await stats_of(a, restarted)
        assert stats_b["weight_version"] == "1" and stats_b["requests"]  # it serves again...
        assert set(stats_b["request_versions"]) == {"1"}  # ...never before it reported "1"
        assert not rids(stats_a) & rids(stats_b)
        versions = {s.version for x in second.samples for s in x.weight_spans}
        assert versions == {"1"}
        fleet = router.statistics().fleet
        assert (fleet.fenced, fleet.catch_ups, fleet.catch_up_gave_up) == (1, 1, 0)
        assert fleet.checked >= 1 and fleet.readmitted >= 1


async def test_an_engine_sigkilled_during_a_weight_update_is_caught_up_when_it_returns(
    tokenizer: Any, tmp_path: Path
) -> None:
    slow = dataclasses.replace(CONFIG, update_latency_s=5.0)  # killed within its load
    async with AsyncExitStack() as stack:
        group = await stack.enter_async_context(TextEngineProcessGroup([CONFIG, slow]))
        a, b = group.processes
        rollout = await stack.enter_async_context(
            TextRollout.open(group.urls, tokenizer=tokenizer, config=SETTINGS)
        )
        router = rollout.router
        results: list[RolloutResult] = []
        caught: list[EngineControlError] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await rollout.run(["Count with me:"] * 16))

            async def update() -> None:
                try:
                    await rollout.update_weights(tmp_path, version="1")
                except EngineControlError as exc:
                    caught.append(exc)

            tg.start_soon(run)
            await wait_until(lambda: router.in_flight(b.url) > 0)
            tg.start_soon(update)
            # a took the weights; b is still reading them: kill it there.
            await reports(a, "1")
            assert not caught and b.pid is not None
            os.kill(b.pid, signal.SIGKILL)
            await wait_until(lambda: bool(caught), timeout_s=20.0)
            restarted = TextEngineProcess(dataclasses.replace(CONFIG, port=port_of(b.url)))
            await stack.enter_async_context(restarted)
            await wait_until(lambda: b.url in router.healthy_urls, timeout_s=30.0)
        # The update's report says which engine took it and which is behind.
        (error,) = caught
        assert set(error.failures) == {b.url}
        assert f"taken by ['{a.url}']" in str(error)
        assert f"caught up from the same source: ['{b.url}']" in str(error)
        assert router.versions.current == "1"
        first = results[0]
        check_exactly_once(first, groups=16, per_group=4)
        failures_name(first, b.url)
        second = await rollout.run(["Count with me:"] * 8)
        check_none_failed(second, groups=8, per_group=4)
        # Every engine ends on the new version and generating (none left paused).
        stats_a, stats_b = await stats_of(a, restarted)
        for stats in (stats_a, stats_b):
            assert stats["weight_version"] == "1" and not stats["paused"]
        assert stats_b["requests"] and set(stats_b["request_versions"]) == {"1"}
        assert not rids(stats_a) & rids(stats_b)
        assert {s.version for x in second.samples for s in x.weight_spans} == {"1"}
        fleet = router.statistics().fleet
        assert fleet.fenced == 1 and fleet.catch_ups == 1
