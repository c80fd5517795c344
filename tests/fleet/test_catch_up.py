"""The weight fence with catch-up, joins and removals (issue 33 items 1 and 2), on
in-process tiny-model stand-ins: an engine restarted with its launch weights and an
engine added mid-rollout serve only after the router brought them to the current weights
(their own request logs say so); a removed engine takes no new work, and its requests
finish (drain) or come back as partial samples (no drain)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from miles_lite.errors import ConfigError
from miles_lite.testing import TinyModelPolicy
from miles_lite.text.config import TextSamplingParams
from tests.support.polling import wait_until
from tests.support.weights import saved

from .conftest import OpenFleet, check_exactly_once, check_none_failed, no_rid_reached_two, stand_in

pytestmark = pytest.mark.anyio

PROMPTS = ["Count with me:", "Say more:", "Go on:", "Once more:"]


async def test_an_engine_restarted_with_its_launch_weights_serves_only_after_catch_up(
    fleet_rollout: OpenFleet, tokenizer: Any, tmp_path: Path
) -> None:
    async with fleet_rollout(TinyModelPolicy(seed=0), TinyModelPolicy(seed=0)) as (
        rollout,
        engines,
    ):
        a, b = engines
        assert a.model is not None
        await saved(a.model.model, tmp_path / "v1", seed=1)
        await rollout.update_weights(tmp_path / "v1", version="1")
        port = int(b.url.rsplit(":", 1)[1])
        await b.aclose()  # dies...
        router = rollout.router
        await wait_until(lambda: router.healthy_urls == (a.url,))
        restarted = stand_in(tokenizer, TinyModelPolicy(seed=0), port=port)  # ...and comes back
        async with restarted:
            assert restarted.weight_version == "default"  # its launch weights
            result = await rollout.run(PROMPTS * 2)
            check_none_failed(result, groups=8, per_group=4)
            await wait_until(lambda: b.url in router.healthy_urls)
            result = await rollout.run(PROMPTS * 2)
            check_exactly_once(result, groups=8, per_group=4)
            stats = restarted.statistics()
            assert stats.weight_loads == 1 and stats.weight_version == "1"
            assert stats.requests  # it serves again...
            assert set(stats.request_versions) == {"1"}  # ...and never before it reported "1"
            assert {s.version for x in result.samples for s in x.weight_spans} == {"1"}
            fleet = router.statistics().fleet
            assert (fleet.checked, fleet.fenced, fleet.catch_ups, fleet.readmitted) == (1, 1, 1, 1)
            no_rid_reached_two(a, restarted)


async def test_an_engine_added_mid_rollout_is_caught_up_then_routed_to_and_takes_later_updates(
    fleet_rollout: OpenFleet, tokenizer: Any, tmp_path: Path
) -> None:
    async with fleet_rollout(TinyModelPolicy(seed=0)) as (rollout, engines):
        (a,) = engines
        assert a.model is not None
        await saved(a.model.model, tmp_path / "v1", seed=1)
        await rollout.update_weights(tmp_path / "v1", version="1")
        router = rollout.router
        async with stand_in(tokenizer, TinyModelPolicy(seed=0)) as joiner:
            async with anyio.create_task_group() as tg:
                results: list[Any] = []

                async def run() -> None:
                    results.append(await rollout.run(PROMPTS * 4))

                tg.start_soon(run)
                await wait_until(lambda: a.statistics().running > 0)
                await rollout.add_engine(joiner.url)  # mid-rollout, on its launch weights
                await wait_until(lambda: joiner.url in router.healthy_urls)
                assert joiner.weight_version == "1"
                with pytest.raises(ConfigError, match="already one of"):
                    await rollout.add_engine(joiner.url)
            check_exactly_once(results[0], groups=16, per_group=4)
            result = await rollout.run(PROMPTS * 4)  # both engines serve it
            check_exactly_once(result, groups=16, per_group=4)
            assert joiner.statistics().requests
            await saved(a.model.model, tmp_path / "v2", seed=2)
            report = await rollout.update_weights(tmp_path / "v2", version="2")
            assert report.ok and set(report.took) == {a.url, joiner.url}
            stats = joiner.statistics()
            assert (stats.weight_loads, stats.weight_version) == (2, "2")
            assert set(stats.request_versions) == {"1"}  # nothing before its catch-up
            fleet = router.statistics().fleet
            assert (fleet.joined, fleet.fenced, fleet.catch_ups) == (1, 1, 1), fleet
            no_rid_reached_two(a, joiner)


@pytest.mark.parametrize("drain", [True, False])
async def test_a_removed_engine_takes_no_new_work_and_its_requests_finish_or_come_back_partial(
    fleet_rollout: OpenFleet, drain: bool
) -> None:
    slow = TextSamplingParams(max_new_tokens=80, extra={"ignore_eos": True})
    policies = (TinyModelPolicy(seed=0), TinyModelPolicy(seed=0))
    async with fleet_rollout(*policies, sampling=slow) as (rollout, engines):
        a, b = engines
        router = rollout.router
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def run() -> None:
                results.append(await rollout.run(PROMPTS * 2))

            tg.start_soon(run)
            await wait_until(lambda: b.statistics().running > 0)
            await rollout.remove_engine(b.url, drain=drain)
            assert router.urls == (a.url,)
            assert b.statistics().running == 0  # its requests ended before it was forgotten
            at_b = len(b.statistics().requests)
        assert len(b.statistics().requests) == at_b  # and it took no new one after
        counts = check_none_failed(results[0], groups=8, per_group=4)
        assert ("aborted" in counts) is not drain
        fleet = router.statistics().fleet
        assert (fleet.removed, fleet.aborted_on_remove) == (1, 0 if drain else 1)
        no_rid_reached_two(a, b)
        with pytest.raises(KeyError):
            await rollout.remove_engine(b.url)
