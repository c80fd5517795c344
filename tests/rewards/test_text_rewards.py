from __future__ import annotations

import pytest

from miles_lite.rewards.text_rewards import (
    extract_boxed,
    f1_reward,
    f1_score,
    final_answer,
    math_reward,
)
from miles_lite.types import Sample


def test_boxed_answers_keep_nested_braces() -> None:
    assert extract_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{7}") == "7"
    assert extract_boxed("x = \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("unclosed \\boxed{3") is None
    assert final_answer("The final answer is 12.") == "12"


@pytest.mark.parametrize(
    ("response", "label", "score"),
    [
        ("It is \\boxed{5}.", "5", 1.0),
        ("It is \\boxed{5.0}", "5", 1.0),
        ("It is \\boxed{$1,000$}", "1000", 1.0),
        ("It is \\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("It is \\boxed{6}", "5", 0.0),
        ("no answer here", "5", 0.0),
    ],
)
def test_math_reward(response: str, label: str, score: float) -> None:
    assert math_reward([Sample(response=response, label=label)]) == [score]


def test_f1() -> None:
    assert f1_score("the Eiffel Tower", "Eiffel tower") == 1.0
    assert f1_score("Paris France", "Paris") == pytest.approx(2 / 3)
    assert f1_reward([Sample(response="answer: Paris", label="Paris")]) == [1.0]
