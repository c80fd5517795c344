"""Inside a training loop, against the real SGLang server: weight updates through
TextRollout.update_weights (retract with a flush, in_place, a version bump), the version
spans of requests in flight across them, the prefix cache after them, the trainer's own
log-probs against the engine's, and the GRPO example learning its toy reward.

The server is the tier's (shared): the weights it serves are put back at the end.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import torch

from miles_lite import SampleStatus, TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.sglang.control import PauseMode
from miles_lite.testing import SGLangServerConfig
from miles_lite.types import Sample

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
#: The trainer's log-probs of the sampled tokens, by the same weights, against the
#: server's: measured 9.5e-7 at most (float32 on this CPU), so 1e-4 leaves a margin of 100.
LOGPROB_TOLERANCE = 1e-4
#: Steps of the GRPO example's run. The policy takes off after 10-25 steps, and in one run
#: in two or three it had not within 25 (the sampling is not seeded: 8 samples of 16
#: tokens a step are a noisy signal), so the run goes on for 50.
STEPS = 50
LONG = TextSamplingParams(max_new_tokens=200, extra={"ignore_eos": True})


@pytest.fixture(scope="module")
def served_model(sglang_url: str) -> Iterator[Path]:
    """The folder of the model the server serves; its weights are pushed back at the end."""
    path = SGLangServerConfig().model
    yield path
    import urllib.request

    body = json.dumps(
        {"model_path": str(path), "weight_version": f"restored-{uuid.uuid4().hex[:8]}"}
    ).encode()
    request = urllib.request.Request(
        f"{sglang_url}/update_weights_from_disk",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert json.loads(answer.read())["success"] is True


@pytest.fixture(scope="module")
def trainer(served_model: Path) -> Any:
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM.from_pretrained(str(served_model)).train(False)


@asynccontextmanager
async def rollout_on(url: str, tokenizer: Any, **config: Any) -> AsyncIterator[TextRollout]:
    settings = TextRolloutConfig(
        sampling=config.pop("sampling", LONG),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=8)),
        **config,
    )
    async with TextRollout.open([url], tokenizer=tokenizer, config=settings) as rollout:
        yield rollout


def perturbed(model: Any, folder: Path, seed: int) -> Any:
    """A copy of ``model`` with other embeddings, saved to ``folder``."""
    new = copy.deepcopy(model)
    with torch.no_grad():
        weight = new.model.embed_tokens.weight
        weight.add_(0.05 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed)))
    new.save_pretrained(str(folder))
    return new


def logprobs(model: Any, sample: Sample) -> list[float]:
    prompt = len(sample.tokens) - sample.response_length
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].float()
        all_lp = torch.log_softmax(logits, dim=-1)
    return [float(all_lp[prompt - 1 + i, t]) for i, t in enumerate(sample.tokens[prompt:])]


async def running(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/loads") as resp:
        loads = await resp.json()
    return int(loads["loads"][0]["num_running_reqs"])


async def across_update(rollout: TextRollout, url: str, folder: Path | None, version: str) -> Any:
    """One prompt's samples, generated across an update to ``version``."""
    out: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            out["result"] = await rollout.run(["Count slowly to one hundred:"])

        tg.start_soon(run)
        with anyio.fail_after(60):
            while True:  # until the engine generates them
                if await running(url):
                    break
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)  # a few tokens first
        out["report"] = await rollout.update_weights(folder, version=version)
    return out["result"], out["report"]


async def test_updates_keep_requests_in_flight_and_every_token_matches_its_weights(
    sglang_url: str, tokenizer: Any, trainer: Any, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    checked = WeightUpdateConfig(verify_flush=True)  # and the flush's effect is checked
    async with rollout_on(
        sglang_url, tokenizer, n_samples_per_prompt=2, weight_update=checked
    ) as rollout:
        base = f"{tag}-0"
        await rollout.update_weights(_save(trainer, tmp_path / "v0"), version=base)
        new = await anyio.to_thread.run_sync(perturbed, trainer, tmp_path / "v1", 1)
        result, report = await across_update(rollout, sglang_url, tmp_path / "v1", f"{tag}-1")
        # A bump alone (the trainer pushed by itself) aborts nothing either.
        bumped, bump = await across_update(rollout, sglang_url, None, f"{tag}-2")
    assert report.ok and report.flushed and report.verify is not None and report.verify.ok
    assert bump.ok and bump.push.action == "update_weight_version"
    weights = {base: trainer, f"{tag}-1": new, f"{tag}-2": new}
    for sample in [*result.samples, *bumped.samples]:
        assert sample.status is SampleStatus.TRUNCATED and sample.finish_reason == "length"
        assert len(sample.weight_spans) == 2, sample.weight_spans
        assert sample.weight_spans[-1].end == sample.response_length == 200
        assert all(s.kv_version is None for s in sample.weight_spans)
    worst = 0.0
    for sample in result.samples:  # every token against the weights of its span
        got = sample.rollout_log_probs
        assert got is not None
        for span in sample.weight_spans:
            expected = await anyio.to_thread.run_sync(logprobs, weights[span.version], sample)
            worst = max(worst, *(abs(got[i] - expected[i]) for i in range(span.start, span.end)))
    print(f"log-prob mismatch across a retract update: max {worst:.2e}")
    assert worst < LOGPROB_TOLERANCE, worst


async def test_in_place_marks_old_kv_and_a_prompt_after_the_update_finds_none_cached(
    sglang_url: str, tokenizer: Any, trainer: Any, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    config = WeightUpdateConfig(mode=PauseMode.IN_PLACE)
    async with rollout_on(sglang_url, tokenizer, weight_update=config) as rollout:
        await rollout.update_weights(_save(trainer, tmp_path / "v0"), version=f"{tag}-0")
        probe = "A prompt that is sent before and after the update."
        before = [await rollout.run([probe]) for _ in range(2)]  # the second hits the first
        new = await anyio.to_thread.run_sync(perturbed, trainer, tmp_path / "v1", 2)
        result, report = await across_update(rollout, sglang_url, tmp_path / "v1", f"{tag}-1")
        after = await rollout.run([probe], rollout_id=99)
    assert report.ok and report.kept_kv and report.flush is None
    off = 0.0
    for sample in result.samples:
        first, second = sample.weight_spans
        assert (first.version, second.version) == (f"{tag}-0", f"{tag}-1")
        assert second.kv_version == f"{tag}-0" and second.end == 200
        # Made by the new weights on the old KV: not what the new weights alone give.
        expected = await anyio.to_thread.run_sync(logprobs, new, sample)
        got = sample.rollout_log_probs
        assert got is not None
        off = max(off, *(abs(got[i] - expected[i]) for i in range(second.start, second.end)))
    print(f"in_place: tokens after the update off the new weights by up to {off:.2e}")
    assert off > 1e-3
    cached = [r.samples[0].prefix_cache_info.cached_tokens for r in before]
    assert cached[1] > 0  # the KV of the same prompt is reused within a version
    assert after.samples[0].prefix_cache_info.cached_tokens == 0  # never across one


def _save(model: Any, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    return folder


def test_the_grpo_example_learns_its_toy_reward(
    sglang_url: str, served_model: Path, tmp_path: Path
) -> None:
    png = tmp_path / "grpo.png"
    command = [
        sys.executable,
        "examples/grpo_loop.py",
        "--url",
        sglang_url,
        "--model",
        str(served_model),
        "--steps",
        str(STEPS),
        "--png",
        str(png),
    ]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    steps, summary = lines[:-1], lines[-1]["summary"]
    print(json.dumps(summary))  # the figures the README quotes
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert summary["mismatch_max"] < LOGPROB_TOLERANCE
    assert summary["lag_max"] <= 1
    first = sum(s["reward"] for s in steps[:3]) / 3
    last = sum(s["reward"] for s in steps[-3:]) / 3
    assert first < 0.65 and last > first + 0.2, (first, last)
    assert png.stat().st_size > 10_000
