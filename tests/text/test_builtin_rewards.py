"""Built-in rewards by name: ``TextRolloutConfig(reward="math")`` needs no ``rewards=``."""

from __future__ import annotations

import pytest

from miles_lite.errors import ConfigError
from miles_lite.rewards import BUILTIN_REWARDS, with_builtin_rewards
from miles_lite.rewards.text_rewards import TEXT_REWARDS, f1_reward, math_reward
from miles_lite.rollout.groups import PromptGroup
from miles_lite.types import SampleStatus
from tests.text.conftest import OpenRollout

pytestmark = pytest.mark.anyio


async def test_a_built_in_reward_named_in_the_config_scores_without_rewards(
    text_rollout: OpenRollout,
) -> None:
    prompts = [
        PromptGroup(prompt="What is 2+3?", label="5"),
        PromptGroup(prompt="What is 2+3?", label="6"),
    ]
    async with text_rollout(n_samples_per_prompt=2, reward="math") as (rollout, _):
        assert set(rollout.rewards) == {"math"}
        result = await rollout.run(prompts)
    assert [s.status for s in result.samples] == [SampleStatus.COMPLETED] * 4
    assert [s.reward for s in result.samples] == [1.0, 1.0, 0.0, 0.0]
    assert result.metrics["perf/reward_max_queue_depth_math"] >= 0


async def test_a_group_reward_resolves_by_name_too(text_rollout: OpenRollout) -> None:
    async with text_rollout(n_samples_per_prompt=2, group_reward="f1") as (rollout, _):
        assert set(rollout.rewards) == {"f1"}
        result = await rollout.run([PromptGroup(prompt="What is 2+3?", label="5")])
    assert [s.reward for s in result.samples] == [1.0, 1.0]


async def test_an_unknown_reward_name_says_the_built_ins_and_what_to_pass(
    text_rollout: OpenRollout,
) -> None:
    with pytest.raises(ConfigError) as info:
        async with text_rollout(reward="mth"):
            pass
    message = str(info.value)
    assert "reward='mth' is not a built-in reward (dapo, deepscaler, f1, math)" in message
    assert "rewards= has no 'mth' (it has [])" in message
    assert "pass rewards={'mth': your_reward}" in message


def test_given_rewards_win_and_the_table_is_the_text_rewards() -> None:
    mine = {"math": f1_reward}
    assert with_builtin_rewards(mine, ["math", None]) == {"math": f1_reward}
    assert with_builtin_rewards({}, ["math", "f1"]) == {"math": math_reward, "f1": f1_reward}
    assert dict(BUILTIN_REWARDS) == TEXT_REWARDS
    with pytest.raises(TypeError):
        BUILTIN_REWARDS["mine"] = f1_reward  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"^group_reward='x' is not a built-in reward"):
        with_builtin_rewards({}, ["x"], field="group_reward")


def test_a_rollout_built_by_hand_without_the_pool_says_what_to_pass() -> None:
    from miles_lite.rollout.scoring import Scorer

    with pytest.raises(ConfigError) as info:
        Scorer({}, reward="math", group_reward=None)
    assert "reward kind 'math' has no pool; have []: pass rewards={'math': your_reward}" in str(
        info.value
    )
    assert "miles_lite.rewards.BUILTIN_REWARDS" in str(info.value)
