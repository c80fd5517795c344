"""An update that fails never strands the rollout (issue 33 item 3): when no engine took
it the version does not move and the next run works on the old one; when some took it
the version moves and the others are fenced (and caught up); the report says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_lite.errors import EngineControlError
from miles_lite.testing import TinyModelPolicy
from tests.support.weights import saved

from .conftest import OpenFleet, check_none_failed

pytestmark = pytest.mark.anyio


async def test_an_update_no_engine_took_moves_nothing_and_the_next_run_works(
    fleet_rollout: OpenFleet, tmp_path: Path
) -> None:
    async with fleet_rollout(TinyModelPolicy(seed=0), TinyModelPolicy(seed=0)) as (
        rollout,
        engines,
    ):
        missing = tmp_path / "no-such-checkpoint"
        with pytest.raises(EngineControlError) as caught:
            await rollout.update_weights(missing, version="1")
        urls = {e.url for e in engines}
        assert set(caught.value.failures) == urls  # each engine named, with its answer
        message = str(caught.value)
        assert "no engine took it" in message and str(missing) in message
        assert all(f"update_weights_from_disk at {url}" in message for url in urls)
        router = rollout.router
        assert router.versions.current is None and router.source is None
        assert set(router.healthy_urls) == urls and not any(e.paused for e in engines)
        report = await rollout.update_weights(missing, version="1", check=False)
        assert not report.moved and report.took == () and report.behind == ()
        result = await rollout.run(["Count with me:", "And again:"])
        counts = check_none_failed(result, groups=2, per_group=4)
        assert "aborted" not in counts
        assert {s.version for x in result.samples for s in x.weight_spans} == {"default"}
        assert router.statistics().fleet.fenced == 0
        # A good update after it works, under the same version.
        first = engines[0].model
        assert first is not None
        await saved(first.model, tmp_path / "v1", seed=1)
        report = await rollout.update_weights(tmp_path / "v1", version="1")
        assert report.ok and report.moved and set(report.took) == urls
        assert router.source is not None and router.source.path == str(tmp_path / "v1")


async def test_an_update_some_engines_took_moves_and_fences_the_others(
    fleet_rollout: OpenFleet, tmp_path: Path
) -> None:
    policies = (TinyModelPolicy(seed=0), TinyModelPolicy(seed=0, hidden_size=16))
    async with fleet_rollout(*policies) as (rollout, engines):
        good, bad = engines
        assert good.model is not None
        await saved(good.model.model, tmp_path / "v1", seed=1)  # does not fit hidden size 16
        with pytest.raises(EngineControlError) as caught:
            await rollout.update_weights(tmp_path / "v1", version="1")
        assert set(caught.value.failures) == {bad.url}
        assert f"taken by ['{good.url}']" in str(caught.value)
        assert f"caught up from the same source: ['{bad.url}']" in str(caught.value)
        router = rollout.router
        assert router.versions.current == "1" and router.healthy_urls == (good.url,)
        served = len(bad.statistics().requests)
        result = await rollout.run(["Count with me:"] * 3)
        check_none_failed(result, groups=3, per_group=4)
        assert {s.version for x in result.samples for s in x.weight_spans} == {"1"}
        assert len(bad.statistics().requests) == served  # nothing went to the fenced one
        fleet = router.statistics().fleet
        assert fleet.fenced == 1 and fleet.catch_ups == 0
        assert router.statistics().engines[1].awaiting_version == "1"
