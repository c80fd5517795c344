"""One spelling for a dropped group's reason and the metrics that count it (issue 30 C)."""

from __future__ import annotations

import pytest

from miles_lite.errors import RolloutWarning
from miles_lite.rollout.filters import FilterResult, drop_reason, drop_zero_std
from miles_lite.rollout.groups import PromptGroup
from miles_lite.types import Sample
from tests.text.conftest import OpenRollout

pytestmark = pytest.mark.anyio

#: The scripted model answers 5: the first group's rewards are all 1.0, the second's 0.0.
PROMPTS = [
    PromptGroup(prompt="What is 2+3?", label="5"),
    PromptGroup(prompt="What is 2+3?", label="6"),
    PromptGroup(prompt="What is 2+3? (odd)", label="5"),
]


def odd(group: list[Sample]) -> FilterResult:
    return FilterResult("odd" not in str(group[0].prompt), "odd")


async def test_a_drop_reason_is_the_metric_name_and_spells_the_value_as_count_does(
    text_rollout: OpenRollout,
) -> None:
    async with text_rollout(n_samples_per_prompt=2, reward="math") as (rollout, _):
        unfiltered = await rollout.run(PROMPTS[:2])
    counted = sorted(k for k in unfiltered.metrics if k.startswith("rollout/zero_std/count_"))
    assert counted == ["rollout/zero_std/count_0.0", "rollout/zero_std/count_1.0"]

    async with text_rollout(
        n_samples_per_prompt=2, reward="math", dynamic_filter=[odd, drop_zero_std()]
    ) as (rollout, _):
        with pytest.warns(RolloutWarning, match="kept 0 of 3 groups"):
            result = await rollout.run(PROMPTS)
    assert result.filter_reasons == ["drop_zero_std_1.0", "drop_zero_std_0.0", "drop_odd"]
    dropped = {k: v for k, v in result.metrics.items() if k.startswith("rollout/dynamic_filter/")}
    assert dropped == {f"rollout/dynamic_filter/{r}": 1.0 for r in result.filter_reasons}
    # The value in a reason is the value in a count: drop_zero_std_1.0 and count_1.0.
    values = sorted(r.removeprefix("drop_zero_std_") for r in result.filter_reasons[:2])
    assert values == [k.removeprefix("rollout/zero_std/count_") for k in counted]
    assert "drop_zero_std_1.0: 1" in result.summary()


def test_a_reason_is_spelt_drop_once() -> None:
    assert drop_reason("odd") == "drop_odd"
    assert drop_reason("drop_odd") == "drop_odd"
    assert drop_reason(None) == drop_reason("") == "drop_filtered"
