"""Rule-based math and F1 rewards: normalisation, DAPO's dict, rm_type per sample in pools."""

from __future__ import annotations

import pickle

import pytest

from miles_lite.pools.reward_pool import RewardPool
from miles_lite.rewards.text_rewards import (
    TEXT_REWARDS,
    dapo_reward,
    f1_reward,
    math_reward,
    normalize_answer,
)
from miles_lite.types import Sample


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("x = 5", "5"),
        ("$5.0$", "5"),
        ("1,000", "1000"),
        ("10\\,000", "10000"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("50\\%", "50"),
        ("5\\text{ dollars}", "5"),
        ("\\text{(B)}", "(B)"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("007", "7"),
        ("3.50", "3.5"),
        ("-0", "0"),
    ],
)
def test_equal_answers_normalise_alike(written: str, canonical: str) -> None:
    assert normalize_answer(written) == canonical


@pytest.mark.parametrize(
    ("response", "label", "score"),
    [
        ("So the angle is \\boxed{90^\\circ}.", "90", 1.0),
        ("We get \\boxed{x = \\frac12}", "\\frac{1}{2}", 1.0),
        ("First \\boxed{3}, no wait, \\boxed{4}", "4", 1.0),  # the last box counts
        ("First \\boxed{3}, no wait, \\boxed{4}", "3", 0.0),
        ("The final answer is $12$.", "12", 1.0),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
        ("I give up.", "5", 0.0),
        ("\\boxed{5}", None, 0.0),
    ],
)
def test_math_reward_reads_the_final_answer(response: str, label: str | None, score: float) -> None:
    assert math_reward([Sample(response=response, label=label)]) == [score]


def test_dapo_reward_is_a_dict_with_score_acc_and_pred() -> None:
    samples = [
        Sample(response="Work...\nAnswer: 42", label="42"),
        Sample(response="Work...\nAnswer: 41", label="42"),
        Sample(response="Boxed then: \\boxed{42}", label="42"),
        Sample(response="no final line", label="42"),
    ]
    assert dapo_reward(samples) == [
        {"score": 1.0, "acc": True, "pred": "42"},
        {"score": -1.0, "acc": False, "pred": "41"},
        {"score": 1.0, "acc": True, "pred": "42"},
        {"score": -1.0, "acc": False, "pred": "[INVALID]"},
    ]


def test_f1_reward_gives_partial_credit() -> None:
    scores = f1_reward(
        [
            Sample(response="The answer is: the Eiffel Tower", label="Eiffel Tower"),
            Sample(response="Paris, France", label="Paris"),
            Sample(response="London", label="Paris"),
            Sample(response="", label=""),
        ]
    )
    assert scores == [1.0, pytest.approx(2 / 3), 0.0, 1.0]


def test_the_rewards_are_named_as_miles_rm_types_and_pickle() -> None:
    assert {"math", "dapo", "f1", "deepscaler"} <= set(TEXT_REWARDS)
    for fn in TEXT_REWARDS.values():
        assert pickle.loads(pickle.dumps(fn)) is fn


@pytest.mark.anyio
async def test_text_rewards_run_in_a_real_reward_pool() -> None:
    samples = [
        Sample(index=0, response="\\boxed{5}", label="5"),
        Sample(index=1, response="\\boxed{6}", label="5"),
    ]
    async with RewardPool("math", math_reward) as math, RewardPool("dapo", dapo_reward) as dapo:
        assert await math.score(samples) == [1.0, 0.0]
        scored = await dapo.score(samples)
    assert [s["score"] for s in scored] == [1.0, -1.0]  # type: ignore[index]
