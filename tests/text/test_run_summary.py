"""``result.summary()``: every run in one line of words; a run keeping nothing warns it."""

from __future__ import annotations

import re
import warnings

import pytest

from miles_lite.errors import RolloutWarning
from miles_lite.rollout.groups import PromptGroup
from miles_lite.rollout.result import RolloutResult, warn_if_none_kept
from miles_lite.types import Sample, SampleStatus
from tests.text.conftest import OpenRollout

pytestmark = pytest.mark.anyio


def broken_reward(samples: list[Sample]) -> list[float]:
    raise RuntimeError("no scorer")


async def test_a_run_that_keeps_its_groups_says_so_in_one_line_and_warns_nothing(
    text_rollout: OpenRollout,
) -> None:
    async with text_rollout(n_samples_per_prompt=2, reward="math") as (rollout, _):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = await rollout.run([PromptGroup(prompt="What is 2+3?", label="5")] * 2)
    assert caught == []
    tokens = sum(s.response_length for s in result.samples)
    assert tokens > 0
    assert re.fullmatch(
        rf"rollout 0: kept 2 of 2 groups; filtered 0; partial 0; failed 0; 4 samples,"
        rf" {tokens} tokens, \d+\.\d\d s",
        result.summary(),
    ), result.summary()


async def test_failed_samples_are_counted_by_group_and_sample(text_rollout: OpenRollout) -> None:
    async with text_rollout(
        n_samples_per_prompt=2, reward="bad", rewards={"bad": broken_reward}
    ) as (rollout, _):
        result = await rollout.run(["What is 2+3?"])
    assert [s.status for s in result.samples] == [SampleStatus.FAILED] * 2
    assert "kept 1 of 1 group; filtered 0; partial 0; failed 1 (2 samples); 2 samples" in (
        result.summary()
    )


def test_a_result_asked_for_a_target_counts_against_it_and_warns_with_the_reasons() -> None:
    result = RolloutResult(
        groups=[],
        filtered=[[], [], []],
        filter_reasons=["drop_zero_std_0.0", "drop_zero_std_1.0", "drop_zero_std_1.0"],
        partial=[[]],
        metrics={"perf/rollout_time": 1.5},
        rollout_id=3,
        target=2,
    )
    line = (
        "rollout 3: kept 0 of 2 groups; filtered 3 (drop_zero_std_1.0: 2,"
        " drop_zero_std_0.0: 1); partial 1; failed 0; 0 samples, 0 tokens, 1.50 s"
    )
    assert result.summary() == line
    with pytest.warns(RolloutWarning) as caught:
        assert warn_if_none_kept(result)
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(line + ": no group to train on (drop_zero_std drops a group")
    assert "result.partial holds the groups left unfinished" in message
    assert warning.filename == __file__  # points at the caller
    # A run of no prompts asked for nothing: no warning.
    assert not warn_if_none_kept(RolloutResult(groups=[]))


def test_the_commands_print_the_summary_before_the_metric_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from miles_lite.cli.report import report

    result = RolloutResult(groups=[], metrics={"perf/rollout_time": 0.25}, target=1)
    report("text", result, as_json=False, pictures={})
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("== text ==")
    assert lines[at + 1] == result.summary()
    assert lines[at + 2].startswith("metric")
    report("text", result, as_json=True, pictures={})
    assert json.loads(capsys.readouterr().out)["summary"] == result.summary()
