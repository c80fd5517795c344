"""The one rule for reward values (miles_lite.rewards.values), as every way a reward
arrives uses it: numbers finite and not bools, dicts whose numbers are finite."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from miles_lite.errors import RewardError
from miles_lite.rewards.values import checked_scores, reward_problem
from miles_lite.types import Sample


@pytest.mark.parametrize(
    "value",
    [0, 1.5, -2, np.float32(0.5), np.int64(3), {"score": 1.0, "acc": True, "pred": "42"}, {}],
)
def test_finite_numbers_and_dicts_of_finite_numbers_are_rewards(value: Any) -> None:
    assert reward_problem(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (math.nan, "must be finite"),
        (-math.inf, "must be finite"),
        (np.float64("nan"), "must be finite"),
        (True, "want a float or a dict"),
        ("1.0", "want a float or a dict"),
        (None, "want a float or a dict"),
        ([1.0], "want a float or a dict"),
        ({"acc": math.nan, "len": 1.0}, "its 'acc' is nan: a reward must be finite"),
        ({1: 1.0}, "its key 1 is not a str"),
    ],
)
def test_everything_else_is_refused_saying_why(value: Any, problem: str) -> None:
    assert problem in str(reward_problem(value))


def _samples(n: int) -> list[Sample]:
    return [
        Sample(index=i, group_index=7, prompt="p", response="r", request_id=f"rid-{i}")
        for i in range(n)
    ]


def test_checked_scores_makes_numbers_floats_and_keeps_dicts() -> None:
    scores = checked_scores("r", [1, np.float32(0.25), {"s": 2}], _samples(3))
    assert scores == [1.0, 0.25, {"s": 2}]
    assert [type(s) for s in scores] == [float, float, dict]


def test_checked_scores_names_the_reward_the_sample_and_the_value() -> None:
    with pytest.raises(RewardError) as info:
        checked_scores("math", [1.0, math.inf], _samples(2))
    message = str(info.value)
    assert "reward 'math' returned inf for sample 1 (group 7)" in message
    assert info.value.request_id == "rid-1"


@pytest.mark.parametrize(("scores", "got"), [([1.0], "1 scores"), ((1.0, 2.0), "tuple")])
def test_checked_scores_refuses_the_wrong_count_or_type(scores: Any, got: str) -> None:
    with pytest.raises(RewardError, match=rf"returned {got} for 2 samples \(indices \[0, 1\]\)"):
        checked_scores("r", scores, _samples(2))
