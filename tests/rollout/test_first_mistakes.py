"""The mistakes a new user makes fail at once, in one line naming what was wrong: an
engine nobody answers, a URL without a scheme, prompts of the wrong type, a reward that
cannot load. Times are bounds in seconds, far above what the code needs, far below the
minutes these mistakes took before."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from miles_lite import (
    ConfigError,
    DiffusionRollout,
    DiffusionRolloutConfig,
    RewardError,
    TextRollout,
    TextRolloutConfig,
)
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.errors import EngineUnavailableError
from miles_lite.rewards.clip_reward import ClipReward
from miles_lite.testing import StandInConfig, StandInEngine, TextStandInConfig, TextStandInEngine

pytestmark = pytest.mark.anyio

#: Nothing listens on the discard port: the connection is refused at once.
NOBODY = "http://127.0.0.1:9"


def config(ready_timeout_s: float | None = 1.0) -> TextRolloutConfig:
    return TextRolloutConfig(
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=4, ready_timeout_s=ready_timeout_s)
        )
    )


async def test_an_engine_nobody_answers_fails_open_in_seconds_naming_it(tokenizer: Any) -> None:
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError) as caught:
        async with TextRollout.open(
            [NOBODY, "http://127.0.0.1:1"], tokenizer=tokenizer, config=config()
        ):
            pytest.fail("opened")
    assert time.monotonic() - started < 20  # was 126-128 s (two 60 s router waits)
    message = str(caught.value)
    assert "\n" not in message and NOBODY in message and "http://127.0.0.1:1" in message
    assert "/health" in message and "ready_timeout_s" in message


async def test_one_silent_engine_among_live_ones_is_logged_not_fatal(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        with caplog.at_level(logging.WARNING, logger="miles_lite.engine.router"):
            async with TextRollout.open([engine.url, NOBODY], tokenizer=tokenizer, config=config()):
                pass
    assert any(
        NOBODY in r.getMessage() and "going on with" in r.getMessage() for r in caplog.records
    )


async def test_engines_still_starting_are_waited_for_when_told(tokenizer: Any) -> None:
    # The stand-in answers /health 503 for its first 1.5 s, as an engine loading weights.
    warming = TextStandInConfig(warmup_s=1.5)
    async with (
        TextStandInEngine(warming, tokenizer) as engine,
        TextRollout.open([engine.url], tokenizer=tokenizer, config=config(30.0)) as rollout,
    ):
        result = await rollout.run(["hi"])
    assert result.metrics["rollout/samples"] == 4 and not result.failed


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "localhost:30000", "//10.0.0.5:30000"])
async def test_a_url_without_a_scheme_is_refused_with_the_fix(tokenizer: Any, url: str) -> None:
    with pytest.raises(ConfigError, match=r"needs an http:// or https:// scheme") as caught:
        async with TextRollout.open([url], tokenizer=tokenizer, config=config()):
            pytest.fail("opened")
    assert "write 'http://" in str(caught.value) and url in str(caught.value)


@pytest.mark.parametrize(
    ("prompts", "says"),
    [
        ("a cat", "run() takes a list of prompts, got str 'a cat': pass e.g. run(['a cat'])"),
        (["fine", 42], "run() prompt 1 is int 42: expected a str, a chat messages list"),
        ([None], "run() prompt 0 is NoneType None"),
        ([{"role": "user", "content": "hi"}], "run() prompt 0 is dict"),
        (
            [[{"content": "hi"}]],
            "run() prompt 0 message 0 is dict {'content': 'hi'}, not a dict with a 'role'",
        ),
        ([[]], "run() prompt 0 is an empty list"),
    ],
)
async def test_run_checks_its_prompts_before_sending_anything(
    tokenizer: Any, prompts: Any, says: str
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        async with TextRollout.open([engine.url], tokenizer=tokenizer, config=config()) as rollout:
            with pytest.raises(ConfigError) as caught:
                await rollout.run(prompts)
        assert engine.statistics().requests == ()
    assert says in str(caught.value) and "\n" not in str(caught.value)


async def test_a_diffusion_rollout_takes_text_prompts_only() -> None:
    async with (
        StandInEngine(StandInConfig()) as engine,
        DiffusionRollout.open([engine.url], config=DiffusionRolloutConfig()) as rollout,
    ):
        with pytest.raises(ConfigError, match=r"prompt 0 is a list .*takes text prompts"):
            await rollout.run([[{"role": "user", "content": "a cat"}]])


async def test_an_empty_run_says_so(tokenizer: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with (
        TextStandInEngine(TextStandInConfig(), tokenizer) as engine,
        TextRollout.open([engine.url], tokenizer=tokenizer, config=config()) as rollout,
    ):
        with caplog.at_level(logging.WARNING, logger="miles_lite.training.rollout"):
            result = await rollout.run([])
    assert result.groups == [] and result.metrics["rollout/prompts"] == 0
    assert any("got no prompts" in r.getMessage() for r in caplog.records)


@pytest.mark.slow_steps_ok  # the reward pool's worker imports torch: not the loop's CPU
async def test_the_readme_diffusion_reward_as_written_fails_open_with_one_reward_error() -> None:
    # The README's checkpoint paths do not exist here: open() fails with the cause, naming
    # the path that failed (the tokenizer's, loaded first), not a BrokenProcessPool.
    reward = ClipReward(model_path="/ckpt/PickScore_v1", tokenizer="/ckpt/CLIP-ViT-H-14")
    config = DiffusionRolloutConfig(reward="pickscore")
    async with StandInEngine(StandInConfig()) as engine:
        with pytest.raises(RewardError) as caught:
            async with DiffusionRollout.open(
                [engine.url], config=config, rewards={"pickscore": reward}
            ):
                pytest.fail("opened")
    message = str(caught.value)
    assert message == (
        "reward 'pickscore' (ClipReward) could not load: ClipReward could not load its"
        " tokenizer from /ckpt/CLIP-ViT-H-14: no such folder"
    )


def test_a_clip_model_path_that_does_not_exist_is_named_as_the_model(tmp_path: Any) -> None:
    from miles_lite.rewards.tiny_clip import tiny_clip

    _, tokenizer_dir = tiny_clip(tmp_path)
    reward = ClipReward(model_path="/ckpt/PickScore_v1", tokenizer=str(tokenizer_dir))
    with pytest.raises(RewardError, match=r"its model from /ckpt/PickScore_v1: no such folder"):
        reward.load()
