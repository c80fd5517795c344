"""A hung engine (SIGSTOP of a stand-in's child process, longer than the read timeout,
then SIGCONT; issue 33 item 4): its requests are never sent elsewhere (they fail typed),
it leaves the rotation, and when it answers again the aborts it missed are sent again and
its version is checked before it serves."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import anyio.to_thread
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy
from miles_lite.errors import EngineTimeoutError
from miles_lite.testing import TextPolicy, TextStandInConfig
from miles_lite.testing.text.process import TextEngineProcessGroup
from tests.support.polling import wait_until

from .conftest import FAST_ROUTER, check_exactly_once

pytestmark = pytest.mark.anyio


def rids(stats: dict[str, Any]) -> set[str]:
    return {str(body.get("rid")) for body in stats["requests"]}


async def test_a_stopped_engine_fails_its_requests_typed_and_is_checked_when_it_answers(
    tokenizer: Any,
) -> None:
    config = TextStandInConfig(token_latency_s=0.02, policy=TextPolicy(default_length=30))
    async with TextEngineProcessGroup([config, config]) as group:
        a, b = group.processes
        settings = TextRolloutConfig(
            sampling=TextSamplingParams(max_new_tokens=30, extra={"ignore_eos": True}),
            engines=EngineConfig(
                router=FAST_ROUTER,
                client=EngineClientConfig(read_timeout_s=1.0, retry=RetryPolicy(max_attempts=2)),
            ),
        )
        async with TextRollout.open(group.urls, tokenizer=tokenizer, config=settings) as rollout:
            router = rollout.router
            assert b.pid is not None
            async with anyio.create_task_group() as tg:
                results: list[Any] = []

                async def run() -> None:
                    results.append(await rollout.run(["Count with me:"] * 6))

                tg.start_soon(run)
                await wait_until(lambda: router.in_flight(b.url) > 0)
                await anyio.sleep(0.1)  # its requests reached it
                os.kill(b.pid, signal.SIGSTOP)
                try:
                    await wait_until(lambda: b.url not in router.healthy_urls, timeout_s=10.0)
                    await anyio.sleep(1.5)  # past the read timeout
                finally:
                    os.kill(b.pid, signal.SIGCONT)
            result = results[0]
            counts = check_exactly_once(result, groups=6, per_group=4)
            failed = [s for g in result.groups + result.partial for s in g if s.error is not None]
            assert counts.get("failed", 0) == len(failed) >= 1
            assert all(isinstance(s.error, EngineTimeoutError) for s in failed)
            assert all(
                s.error.url == b.url for s in failed if isinstance(s.error, EngineTimeoutError)
            )
            await wait_until(lambda: b.url in router.healthy_urls, timeout_s=10.0)
            fleet = router.statistics().fleet
            assert fleet.checked >= 1 and fleet.readmitted >= 1 and fleet.stale_aborts >= 1
            stats_a, stats_b = await anyio.to_thread.run_sync(lambda: (a.stats(), b.stats()))
            assert not rids(stats_a) & rids(stats_b)  # none sent to both
            # Every stale rid's abort reached it once it answered again.
            aborted = [x for x in stats_b["aborts"] if isinstance(x, dict) and x.get("rid")]
            assert len(aborted) >= len(failed)
