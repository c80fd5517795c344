"""The text stand-in's weight-update behaviour, as SGLang 0.5.23's: pause modes and their
KV, flushes refused while requests run, the update-under-in_place trap, the tiny model's
weights loaded from a save_pretrained folder, cached_tokens per extra_key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import torch

from miles_lite.testing import TextStandInConfig, TextStandInEngine, TinyModelPolicy

from .test_text_engine import post, wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def flush(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.post(f"{url}/flush_cache") as resp:
        return resp.status, await resp.text()


#: The prompt of every request here (and of the log-probs recomputed from it).
PROMPT = [11, 12, 13, 14, 15]


def long_body(n: int = 40, **extra: Any) -> dict[str, Any]:
    return {
        "input_ids": list(PROMPT),
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        **extra,
    }


async def test_flush_is_refused_while_requests_run_and_in_place_update_fails_after_the_swap(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(token_latency_s=0.01), tokenizer) as engine:
        url = engine.url
        assert await flush(http, url) == (
            200,
            "Cache flushed.\nPlease check backend logs for more details. (When there are"
            " running or waiting requests, the operation will not be performed.)\n",
        )
        answers: list[Any] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _collect(http, url, answers))
            await wait_until(lambda: engine.stats.generated_tokens >= 2)
            assert await flush(http, url) == (400, "Flush cache failed.\n")  # running
            await post(http, f"{url}/pause_generation", {"mode": "in_place"})
            assert (await flush(http, url))[0] == 400  # held in place: still running
            status, answer = await post(
                http,
                f"{url}/update_weights_from_disk",
                {"model_path": "/models/x", "weight_version": "v2"},
            )
            assert status == 400 and answer["success"] is False
            assert "cache was not flushed" in answer["message"]
            async with http.get(f"{url}/model_info") as resp:
                assert (await resp.json())["weight_version"] == "default"  # not moved yet
            status, answer = await post(
                http,
                f"{url}/update_weights_from_disk",
                {"model_path": "/models/x", "weight_version": "v2", "flush_cache": False},
            )
            assert status == 200 and answer["success"] is True
            async with http.get(f"{url}/model_info") as resp:
                assert (await resp.json())["weight_version"] == "v2"
            await post(http, f"{url}/pause_generation", {"mode": "retract"})
            assert (await flush(http, url))[0] == 200  # retracted: flushable
            await post(http, f"{url}/continue_generation", {})
        spans = answers[0]["meta_info"]["weight_versions"]
        # The tokens' version moved with the failed update already, as SGLang's does.
        assert [s["version"] for s in spans] == ["default", "v2"]
        stats = engine.statistics()
        assert (stats.flushes, stats.flush_refusals, stats.pauses) == (2, 3, 2)


async def _collect(http: aiohttp.ClientSession, url: str, answers: list[Any]) -> None:
    answers.append((await post(http, f"{url}/generate", long_body()))[1])


async def test_cached_tokens_are_counted_per_extra_key_until_a_flush(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        url = f"{engine.url}/generate"

        async def cached(**extra: Any) -> int:
            status, answer = await post(http, url, long_body(2, **extra))
            assert status == 200, answer
            return int(answer["meta_info"]["cached_tokens"])

        assert [await cached(), await cached()] == [0, 4]  # all but the last prompt token
        assert [await cached(extra_key="a"), await cached(extra_key="a")] == [0, 4]
        assert await cached(extra_key="b") == 0
        assert (await flush(http, engine.url))[0] == 200
        assert await cached(extra_key="a") == 0
        status, _ = await post(http, url, long_body(2, extra_key=7))
        assert status == 400


async def test_the_tiny_model_loads_new_weights_and_retract_recomputes_only_after_a_flush(
    tokenizer: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = TextStandInConfig(token_latency_s=0.01, policy=TinyModelPolicy(seed=1))
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        model = engine.model
        assert model is not None
        weights = {"default": model.model}
        for seed, version in ((5, "v2"), (6, "v3")):
            weights[version] = _perturbed(model.model, seed)
            await anyio.to_thread.run_sync(
                weights[version].save_pretrained, str(tmp_path / version)
            )
        status, answer = await post(
            http, f"{url}/update_weights_from_disk", {"model_path": str(tmp_path / "missing")}
        )
        assert status == 400 and "no *.safetensors" in answer["message"]

        async def update_mid_request(flush_cache: bool, version: str) -> Any:
            answers: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _collect(http, url, answers))
                start = engine.stats.generated_tokens
                await wait_until(lambda: engine.stats.generated_tokens >= start + 5)
                await post(http, f"{url}/pause_generation", {"mode": "retract"})
                path = str(tmp_path / version)
                body = {"model_path": path, "weight_version": version, "flush_cache": flush_cache}
                status, _ = await post(http, f"{url}/update_weights_from_disk", body)
                assert status == 200
                await post(http, f"{url}/continue_generation", {})
            return answers[0]

        exact = await update_mid_request(True, "v2")
        stale = await update_mid_request(False, "v3")
        assert engine.statistics().weight_loads == 2
    for answer, expect_exact in ((exact, True), (stale, False)):
        spans = answer["meta_info"]["weight_versions"]
        assert len(spans) == 2 and spans[-1]["end"] == 40
        cut = spans[0]["end"]
        out = answer["output_ids"]
        reported = [lp for lp, _, _ in answer["meta_info"]["output_token_logprobs"]]
        before = await anyio.to_thread.run_sync(_logprobs, weights[spans[0]["version"]], out)
        after = await anyio.to_thread.run_sync(_logprobs, weights[spans[1]["version"]], out)
        assert max(abs(a - b) for a, b in zip(reported[:cut], before[:cut], strict=True)) < 1e-4
        off = [abs(a - b) for a, b in zip(reported[cut:], after[cut:], strict=True)]
        if expect_exact:
            assert max(off) < 1e-4  # recomputed under the new weights
        else:
            assert max(off) > 1e-3  # the old KV was reused: exactly that KV
            stale = await anyio.to_thread.run_sync(
                _stale_logprobs,
                weights[spans[0]["version"]],
                weights[spans[1]["version"]],
                out,
                cut,
            )
            assert max(abs(a - b) for a, b in zip(reported[cut:], stale, strict=True)) < 1e-4


def _perturbed(module: Any, seed: int) -> Any:
    """``module`` with every weight matrix moved: the embedding (tied to the output layer)
    by 0.5, the others by 0.1. Moving the embedding alone left the tiny model's later
    log-probs almost blind to which weights made the earlier tokens' KV (under 1e-3 for 6%
    of token sequences, down to 1e-5: the stale check flaked); with attention moved too,
    KV of other weights moves them by 0.03 or more (200 sequences, each at a random cut)."""
    import copy

    trained = copy.deepcopy(module)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for name, weight in trained.named_parameters():
            if name.endswith("embed_tokens.weight"):
                weight.add_(0.5 * torch.randn(weight.shape, generator=generator))
            elif weight.dim() == 2:
                weight.add_(0.1 * torch.randn(weight.shape, generator=generator))
    return trained


def _logprobs(module: Any, out: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = module(input_ids=torch.tensor([[*PROMPT, *out]])).logits[0].float()
        all_lp = torch.log_softmax(logits, dim=-1)
    return [float(all_lp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(out)]


def _stale_logprobs(old: Any, new: Any, out: list[int], cut: int) -> list[float]:
    """The log-probs of ``out[cut:]`` when the KV of the prompt and ``out[: cut - 1]`` was
    made by ``old`` and kept, and ``new`` runs from the token before ``cut`` on: what a
    retract pause without a flush leaves."""
    import inspect

    # transformers >= 5.2x names the KV cache argument ``cache``; before, ``past_key_values``.
    key = "cache" if "cache" in inspect.signature(new.forward).parameters else "past_key_values"
    with torch.inference_mode():
        first = old(input_ids=torch.tensor([[*PROMPT, *out[: cut - 1]]]), use_cache=True)
        rest = new(input_ids=torch.tensor([out[cut - 1 : -1]]), use_cache=True, **{key: first[key]})
        all_lp = torch.log_softmax(rest.logits[0].float(), dim=-1)
    return [float(all_lp[i, t]) for i, t in enumerate(out[cut:])]
