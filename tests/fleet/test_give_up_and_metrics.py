"""A catch-up that keeps failing gives up after ``RouterConfig.max_catch_up_tries`` (the
engine stays out, logged, counted), and the fleet's transitions appear in each run's
metrics as the delta over that run (issue 33 items 2 and 4)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

from miles_lite.engine.config import RouterConfig
from miles_lite.engine.fleet import FleetStatistics
from miles_lite.errors import ConfigError, EngineControlError
from miles_lite.testing import TinyModelPolicy
from tests.support.polling import wait_until
from tests.support.weights import saved

from .conftest import FAST_ROUTER, OpenFleet, check_exactly_once, check_none_failed

pytestmark = pytest.mark.anyio

FLEET_KEYS = {f"fleet/{name}" for name in FleetStatistics.__slots__}


def test_max_catch_up_tries_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_catch_up_tries"):
        RouterConfig(max_inflight_per_engine=4, max_catch_up_tries=0)


async def test_a_catch_up_failing_on_one_folder_gives_up_and_the_run_metrics_count_it(
    fleet_rollout: OpenFleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    router_config = dataclasses.replace(FAST_ROUTER, max_catch_up_tries=2)
    policies = (TinyModelPolicy(seed=0), TinyModelPolicy(seed=0, hidden_size=16))
    async with fleet_rollout(*policies, router=router_config) as (rollout, engines):
        good, bad = engines
        assert good.model is not None
        await saved(good.model.model, tmp_path / "v1", seed=1)  # does not fit hidden size 16
        router = rollout.router
        results: list[Any] = []
        caplog.set_level(logging.ERROR, logger="miles_lite.engine.fleet")
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await rollout.run(["Count with me:"] * 48))

            tg.start_soon(run)
            await wait_until(lambda: good.statistics().running > 0)
            with pytest.raises(EngineControlError):  # mid-run: the bad engine did not take it
                await rollout.update_weights(tmp_path / "v1", version="1")
            assert not results  # the update (and its fence) fell within the run
        first = results[0]
        check_exactly_once(first, groups=48, per_group=4)
        assert set(first.metrics) >= FLEET_KEYS
        assert first.metrics["fleet/fenced"] == 1.0
        assert first.metrics["fleet/joined"] == first.metrics["fleet/removed"] == 0.0

        await wait_until(lambda: router.statistics().fleet.catch_up_gave_up == 1, 30.0)
        fleet = router.statistics().fleet
        assert (fleet.catch_up_failures, fleet.catch_ups, fleet.readmitted) == (2, 0, 0)
        given_up = [r for r in caplog.records if "gave up after 2 failed tries" in r.message]
        assert len(given_up) == 1 and bad.url in given_up[0].message
        # Health rounds go on, the engine answers /health and /model_info, and still no
        # third try: it stays out until the next update or its next return.
        rounds = router.statistics().health_rounds
        await wait_until(lambda: router.statistics().health_rounds >= rounds + 5, 30.0)
        assert router.statistics().fleet.catch_up_failures == 2
        assert router.healthy_urls == (good.url,)
        served = len(bad.statistics().requests)
        second = await rollout.run(["Count with me:"] * 3)
        check_none_failed(second, groups=3, per_group=4)
        assert len(bad.statistics().requests) == served
        # The second run's metrics are its own delta: nothing moved during it.
        assert {second.metrics[k] for k in FLEET_KEYS} == {0.0}
        assert router.statistics().engines[1].awaiting_version == "1"
