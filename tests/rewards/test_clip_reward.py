"""ClipReward on a tiny random CLIP: conventions, agreement with transformers, process pools."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import CLIPConfig, CLIPModel, CLIPTokenizerFast

from miles_lite.errors import ConfigError, RewardError
from miles_lite.rewards.clip_reward import CLIP_MEAN, CLIP_STD, ClipReward
from miles_lite.rewards.tiny_clip import tiny_clip
from miles_lite.types import Sample

# Set in a pool worker by _install, as a reward pool keeps its function resident.
_WORKER_REWARD: ClipReward | None = None


def _install(reward: ClipReward) -> None:
    global _WORKER_REWARD
    torch.set_num_threads(1)
    _WORKER_REWARD = reward


def _score_resident(samples: list[Sample]) -> tuple[list[float], bool, int]:
    assert _WORKER_REWARD is not None
    was_loaded = _WORKER_REWARD.loaded
    return _WORKER_REWARD(samples), was_loaded, os.getpid()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[CLIPConfig, Path]:
    return tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


@pytest.fixture(scope="module")
def reward(tiny: tuple[CLIPConfig, Path]) -> ClipReward:
    config, tok_dir = tiny
    return ClipReward(config=config, tokenizer=tok_dir, seed=0)


@pytest.fixture(scope="module")
def pool(reward: ClipReward) -> Iterator[ProcessPoolExecutor]:
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(
        max_workers=1, mp_context=ctx, initializer=_install, initargs=(reward,)
    ) as executor:
        yield executor


def image(seed: int, shape: tuple[int, ...] = (3, 32, 32)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def sample(prompt: str, output: torch.Tensor, index: int = 0) -> Sample:
    return Sample(index=index, prompt=prompt, generated_output=output)


def score1(reward: ClipReward, prompt: str, output: torch.Tensor) -> float:
    return reward([sample(prompt, output)])[0]


def test_scores_are_deterministic_and_depend_on_prompt_and_seed(
    reward: ClipReward, tiny: tuple[CLIPConfig, Path]
) -> None:
    config, tok_dir = tiny
    img = image(1)
    first = score1(reward, "a red cat", img)
    assert isinstance(first, float)
    assert score1(reward, "a red cat", img) == first
    assert score1(ClipReward(config=config, tokenizer=tok_dir, seed=0), "a red cat", img) == first
    assert score1(reward, "a blue dog on the moon", img) != pytest.approx(first, abs=1e-4)
    assert score1(
        ClipReward(config=config, tokenizer=tok_dir, seed=1), "a red cat", img
    ) != pytest.approx(first, abs=1e-4)


def test_scores_match_clipmodel_features_computed_by_hand(
    reward: ClipReward, tiny: tuple[CLIPConfig, Path]
) -> None:
    config, tok_dir = tiny
    img = image(2)  # already image_size x image_size: no resize involved
    prompt = "a photo of a cat"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CLIPModel(config).eval()
    tokenizer = CLIPTokenizerFast.from_pretrained(tok_dir)
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    with torch.inference_mode():
        ids = tokenizer([prompt], return_tensors="pt")
        text = model.get_text_features(**ids)
        pixels = model.get_image_features(pixel_values=((img - mean) / std).unsqueeze(0))
        text = text if isinstance(text, torch.Tensor) else text.pooler_output
        pixels = pixels if isinstance(pixels, torch.Tensor) else pixels.pooler_output
        cosine = torch.nn.functional.cosine_similarity(text, pixels)[0]
        expected = float(model.logit_scale.exp() * cosine)
        # CLIPModel.forward says the same (its logits are the PickScore score).
        logits = model(**ids, pixel_values=((img - mean) / std).unsqueeze(0)).logits_per_image
    assert score1(reward, prompt, img) == pytest.approx(expected, abs=1e-4)
    assert float(logits[0, 0]) == pytest.approx(expected, abs=1e-4)


def test_a_batch_scores_like_one_sample_at_a_time(reward: ClipReward) -> None:
    samples = [
        sample("a cat", image(3), 0),
        sample("a much longer prompt about a dog in the park", image(4, (2, 3, 40, 56)), 1),
        sample("a cat", image(5, (4, 16, 16)), 2),
    ]
    alone = [reward([s])[0] for s in samples]
    assert reward(samples) == pytest.approx(alone, abs=1e-4)
    assert reward([]) == []


def test_image_layouts_follow_the_documented_conventions(reward: ClipReward) -> None:
    prompt = "a small house"
    img = image(6)
    base = score1(reward, prompt, img)
    assert score1(reward, prompt, img.unsqueeze(1)) == pytest.approx(base, abs=1e-5)
    assert score1(reward, prompt, img[None, :, None]) == pytest.approx(base, abs=1e-5)
    # Video, in SGLang's [C, F, H, W]: the mean of the frame scores.
    frames = torch.stack([img, image(7), image(8)], dim=1)
    per_frame = [score1(reward, prompt, frames[:, f]) for f in range(3)]
    assert score1(reward, prompt, frames) == pytest.approx(sum(per_frame) / 3, abs=1e-4)
    # Value ranges: [-1, 1] with value_range=(-1, 1), and uint8 in [0, 255].
    signed = ClipReward(
        config=reward.config, tokenizer=reward.tokenizer, seed=reward.seed, value_range=(-1.0, 1.0)
    )
    assert score1(signed, prompt, img * 2 - 1) == pytest.approx(base, abs=1e-4)
    as_uint8 = (img * 255).round().to(torch.uint8)
    assert score1(reward, prompt, as_uint8) == pytest.approx(
        score1(reward, prompt, as_uint8.float() / 255), abs=1e-5
    )
    # Stand-in latents: channels taken modulo C (first 3 of 4; gray repeated).
    latents = torch.randn(4, 32, 32, generator=torch.Generator().manual_seed(9))
    assert score1(reward, prompt, latents) == pytest.approx(
        score1(reward, prompt, latents[:3]), abs=1e-5
    )
    gray = image(10, (1, 32, 32))
    assert score1(reward, prompt, gray) == pytest.approx(
        score1(reward, prompt, gray.repeat(3, 1, 1)), abs=1e-5
    )
    # Other sizes are resized and center-cropped; bf16 is read as float.
    odd = image(11, (3, 48, 80))
    assert torch.isfinite(torch.tensor(score1(reward, prompt, odd)))
    assert score1(reward, prompt, odd.to(torch.bfloat16)) == pytest.approx(
        score1(reward, prompt, odd.to(torch.bfloat16).float()), abs=1e-5
    )


@pytest.mark.parametrize(
    ("output", "prompt", "needle"),
    [
        (None, "a cat", "no generated_output"),
        (torch.rand(32, 32), "a cat", "shape [32, 32]"),
        (torch.rand(2, 2, 3, 32, 32), "a cat", "shape [2, 2, 3, 32, 32]"),
        (torch.rand(3, 32, 32), [{"role": "user", "content": "a cat"}], "list prompt"),
    ],
)
def test_bad_samples_raise_reward_error_naming_the_sample(
    reward: ClipReward, output: Any, prompt: Any, needle: str
) -> None:
    good = sample("a dog", image(12), 0)
    bad = Sample(index=7, prompt=prompt, generated_output=output)
    with pytest.raises(RewardError, match=re.escape(needle)) as info:
        reward([good, bad])
    assert "sample 7" in str(info.value)


def test_bad_options_raise_config_error(tiny: tuple[CLIPConfig, Path]) -> None:
    config, tok_dir = tiny
    with pytest.raises(ConfigError, match="exactly one of"):
        ClipReward()
    with pytest.raises(ConfigError, match="exactly one of"):
        ClipReward(model_path="/x", config=config, tokenizer=tok_dir)
    with pytest.raises(ConfigError, match="needs tokenizer"):
        ClipReward(config=config)
    with pytest.raises(ConfigError, match="value_range"):
        ClipReward(config=config, tokenizer=tok_dir, value_range=(1.0, 0.0))
    with pytest.raises(ConfigError, match="dtype"):
        ClipReward(config=config, tokenizer=tok_dir, dtype="int8")


def test_a_missing_checkpoint_raises_reward_error(tmp_path: Path) -> None:
    reward = ClipReward(model_path=tmp_path / "nowhere")
    with pytest.raises(RewardError, match="could not load"):
        reward.load()


def test_a_saved_checkpoint_loads_with_from_pretrained_and_scores_the_same(
    reward: ClipReward, tiny: tuple[CLIPConfig, Path], tmp_path: Path
) -> None:
    config, tok_dir = tiny
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        CLIPModel(config).save_pretrained(tmp_path)
    CLIPTokenizerFast.from_pretrained(tok_dir).save_pretrained(tmp_path)
    from_disk = ClipReward(model_path=tmp_path)
    samples = [sample("a cat", image(13), 0), sample("a dog", image(14), 1)]
    assert from_disk(samples) == pytest.approx(reward(samples), abs=1e-5)


def test_pickles_without_weights_and_scores_in_a_process_pool(
    reward: ClipReward, pool: ProcessPoolExecutor
) -> None:
    samples = [sample("a cat", image(15), 0), sample("two dogs", image(16, (2, 4, 24, 24)), 1)]
    expected = reward(samples)
    assert reward.loaded
    assert len(pickle.dumps(reward)) < 4096  # options only, even once loaded
    assert not pickle.loads(pickle.dumps(reward)).loaded

    # Shipped per call: the worker's copy loads on its first call.
    assert pool.submit(reward, samples).result(timeout=60) == pytest.approx(expected, abs=1e-4)
    # Resident in the worker (as a reward pool keeps it): loads once, then reuses.
    scores, was_loaded, pid = pool.submit(_score_resident, samples).result(timeout=60)
    again, was_loaded_again, pid_again = pool.submit(_score_resident, samples).result(timeout=60)
    assert scores == pytest.approx(expected, abs=1e-4)
    assert again == scores
    assert (was_loaded, was_loaded_again) == (False, True)
    assert pid == pid_again != os.getpid()
