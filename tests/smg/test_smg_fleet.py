"""The fleet behind SGLang's router (issue 33): an engine behind smg that reports another
weight version is taken off smg's worker list (smg routes it nothing new; the other
engines take every request meanwhile), caught up from the last update's source and
registered again; add_engine/remove_engine use smg's worker API (POST/DELETE /workers)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import (
    EngineClientConfig,
    EngineConfig,
    RetryPolicy,
    RouterConfig,
    SmgConfig,
)
from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.testing import (
    SmgRouter,
    TextEngineProcess,
    TextEngineProcessGroup,
    TextPolicy,
    TextStandInConfig,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio

CONFIG = TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(default_length=16))


def settings(workers: int) -> TextRolloutConfig:
    return TextRolloutConfig(
        n_samples_per_prompt=2,
        sampling=TextSamplingParams(max_new_tokens=16, extra={"ignore_eos": True}),
        engines=EngineConfig(
            router=RouterConfig(
                max_inflight_per_engine=16,
                health_interval_s=0.2,
                smg=SmgConfig(min_workers=workers, open_timeout_s=30),
            ),
            client=EngineClientConfig(
                total_timeout_s=60, retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.2)
            ),
        ),
    )


async def stats(engine: TextEngineProcess) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(engine.stats)


def listed(rollout: TextRollout) -> dict[str, str]:
    """smg's worker list as the router read it last: url -> status."""
    return {w.url: w.status for w in rollout.router.statistics().workers if w.healthy}


async def test_an_engine_behind_smg_on_other_weights_is_off_smg_until_caught_up(
    tokenizer: Any, tmp_path: Path
) -> None:
    slow = dataclasses.replace(CONFIG, update_latency_s=1.0)  # a catch-up takes a second
    async with TextEngineProcessGroup([CONFIG, slow]) as group:
        a, b = group.processes
        async with SmgRouter(group.urls, flags=SMG_FLAGS) as smg:
            config = settings(workers=2)
            async with TextRollout.open([smg.url], tokenizer=tokenizer, config=config) as rollout:
                router = rollout.router
                report = await rollout.update_weights(tmp_path, version="1")
                assert report.ok and set(report.took) == {a.url, b.url}
                # b goes back to other weights behind the fleet's back...
                await anyio.to_thread.run_sync(
                    lambda: b.call_json(
                        "/update_weight_version",
                        {"new_version": "0", "abort_all_requests": False},
                    )
                )
                served_b = len((await stats(b))["requests"])
                assert not router.reported_version(b.url, "0")  # ...and says so
                await wait_until(lambda: b.url not in listed(rollout), timeout_s=10.0)
                # Meanwhile smg routes every request to a.
                result = await rollout.run(["Count with me:"] * 4)
                assert len(result.samples) == 8 and not any(s.error for s in result.samples)
                fleet = router.statistics().fleet
                if fleet.readmitted == 0:  # b still catching up: it got nothing new
                    assert len((await stats(b))["requests"]) == served_b
                await wait_until(lambda: router.statistics().fleet.readmitted == 1, 20.0)
                await wait_until(lambda: b.url in listed(rollout), timeout_s=20.0)
                result = await rollout.run(["Count with me:"] * 16)
                assert not any(s.error for s in result.samples)
                assert {v for s in result.samples for v in s.weight_versions} == {"1"}
        stats_b = await stats(b)
        assert stats_b["weight_version"] == "1" and len(stats_b["requests"]) > served_b
        assert "0" not in stats_b["request_versions"]  # nothing reached it on "0"
        fleet = router.statistics().fleet
        assert (fleet.fenced, fleet.catch_ups, fleet.readmitted) == (1, 1, 1)


async def test_add_and_remove_engine_through_smg_use_its_worker_api(
    tokenizer: Any, tmp_path: Path
) -> None:
    async with TextEngineProcessGroup([CONFIG, CONFIG]) as group:
        a, b = group.processes
        async with SmgRouter([a.url], flags=SMG_FLAGS) as smg:
            config = settings(workers=1)
            async with TextRollout.open([smg.url], tokenizer=tokenizer, config=config) as rollout:
                router = rollout.router
                await rollout.update_weights(tmp_path, version="1")
                assert router.update_targets() == (a.url,)
                # b joins on its launch weights: caught up first, then registered at smg.
                assert not await rollout.add_engine(b.url)
                await wait_until(lambda: b.url in listed(rollout), timeout_s=20.0)
                assert (await stats(b))["weight_version"] == "1"
                result = await rollout.run(["Count with me:"] * 16)
                assert not any(s.error for s in result.samples)
                served = len((await stats(b))["requests"])
                assert served > 0 and set((await stats(b))["request_versions"]) == {"1"}
                fleet = router.statistics().fleet
                assert (fleet.fenced, fleet.catch_ups, fleet.readmitted) == (1, 1, 1)
                # Removed (drained): smg routes it nothing new.
                await rollout.remove_engine(b.url, drain=True)
                await wait_until(lambda: b.url not in listed(rollout), timeout_s=10.0)
                result = await rollout.run(["Count with me:"] * 8)
                assert not any(s.error for s in result.samples)
                assert len((await stats(b))["requests"]) == served
                with pytest.raises(KeyError):
                    await rollout.remove_engine("http://127.0.0.1:9", drain=True)
