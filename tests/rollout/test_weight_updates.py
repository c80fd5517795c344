"""update_weights on a text rollout over stand-ins running the tiny model: requests in
flight survive an update and their samples say which version made which token (and, where
the mode kept old KV, which tokens were made on it); an engine that missed the update
serves nothing until it reports the version; a cancelled update still lets the engines
continue."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from miles_lite import SampleStatus, TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.mock import MockResponse, MockTransport
from miles_lite.engine.http.transport import Request
from miles_lite.engine.router import Router
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.errors import ConfigError, EngineControlError
from miles_lite.sglang.control import PauseMode
from miles_lite.testing import TextStandInConfig, TextStandInEngine, TinyModelPolicy
from miles_lite.types import Sample
from tests.support.polling import wait_until
from tests.support.weights import saved

pytestmark = pytest.mark.anyio

LONG = TextSamplingParams(max_new_tokens=12, extra={"ignore_eos": True})

Open = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, list[TextStandInEngine]]]]


@pytest.fixture
def tiny_rollout(tokenizer: Any) -> Open:
    """``async with tiny_rollout(*policies, **config) as (rollout, engines)``: one stand-in
    per tiny-model policy (10 ms a token), a text rollout over them."""

    @asynccontextmanager
    async def open_rollout(
        *policies: TinyModelPolicy, **config: Any
    ) -> AsyncIterator[tuple[TextRollout, list[TextStandInEngine]]]:
        engines = [
            TextStandInEngine(TextStandInConfig(token_latency_s=0.01, policy=p), tokenizer)
            for p in policies or (TinyModelPolicy(seed=0),)
        ]
        try:
            for engine in engines:
                await engine.__aenter__()
            config.setdefault("sampling", LONG)
            settings = TextRolloutConfig(
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=8, health_interval_s=0.05),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
                **config,
            )
            urls = [e.url for e in engines]
            async with TextRollout.open(urls, tokenizer=tokenizer, config=settings) as rollout:
                yield rollout, engines
        finally:
            with anyio.CancelScope(shield=True):
                for engine in engines:
                    await engine.aclose()

    return open_rollout


def token_logprobs(module: Any, sample: Sample) -> list[float]:
    prompt = len(sample.tokens) - sample.response_length
    with torch.inference_mode():
        logits = module(input_ids=torch.tensor([sample.tokens])).logits[0].float()
        all_lp = torch.log_softmax(logits, dim=-1)
    return [float(all_lp[prompt - 1 + i, t]) for i, t in enumerate(sample.tokens[prompt:])]


def in_place_logprobs(old: Any, new: Any, sample: Sample, boundary: int) -> list[float]:
    """The log-probs of the response from offset ``boundary`` on, as an engine makes them
    after an ``in_place`` update there: the step that makes the first new token runs the
    token before it with the new weights, on the KV the old weights made of everything
    earlier."""
    cut = len(sample.tokens) - sample.response_length + boundary
    # transformers >= 5.2x names the KV cache ``cache``; before, ``past_key_values``.
    key = "cache" if "cache" in inspect.signature(new.forward).parameters else "past_key_values"
    with torch.inference_mode():
        past = old(input_ids=torch.tensor([sample.tokens[: cut - 1]]), use_cache=True)
        out = new(
            input_ids=torch.tensor([sample.tokens[cut - 1 :]]), use_cache=True, **{key: past[key]}
        )
        all_lp = torch.log_softmax(out.logits[0].float(), dim=-1)
    return [float(all_lp[i, t]) for i, t in enumerate(sample.tokens[cut:])]


async def run_across_update(
    rollout: TextRollout, engine: TextStandInEngine, path: Path, version: str, **kw: Any
) -> tuple[Any, Any]:
    """A rollout of one prompt, the weights updated once every sample made 3 tokens."""
    out: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            out["result"] = await rollout.run(["Count with me:"])

        start = engine.stats.generated_tokens
        tg.start_soon(run)
        need = start + 3 * rollout.config.n_samples_per_prompt
        await wait_until(lambda: engine.stats.generated_tokens >= need)
        out["report"] = await rollout.update_weights(path, version=version, **kw)
    return out["result"], out["report"]


async def test_retract_with_a_flush_keeps_requests_and_every_token_matches_its_versions_weights(
    tiny_rollout: Open, tmp_path: Path
) -> None:
    checked = WeightUpdateConfig(verify_flush=True)
    async with tiny_rollout(n_samples_per_prompt=2, weight_update=checked) as (
        rollout,
        (engine,),
    ):
        assert engine.model is not None
        old = engine.model.model
        new = await saved(old, tmp_path / "v1", seed=1)
        result, report = await run_across_update(rollout, engine, tmp_path / "v1", "1")
        after = await rollout.run(["Count with me:"])
        stats = engine.statistics()
    assert report.ok and report.flushed and not report.kept_kv and report.mode is PauseMode.RETRACT
    assert report.verify is not None and report.verify.ok  # the canary found nothing cached
    assert [s.action for s in report.stages][:2] == [
        "plant_cache_canary",
        "pause_generation(retract)",
    ]
    assert (stats.pauses, stats.weight_loads, stats.flushes, stats.aborts) == (1, 1, 1, ())
    weights = {"default": old, "1": new}
    for sample in result.samples:
        assert sample.status is SampleStatus.TRUNCATED and sample.response_length == 12
        assert [s.version for s in sample.weight_spans] == ["default", "1"]
        assert sample.weight_spans[0].end == sample.weight_spans[1].start
        assert all(s.kv_version is None for s in sample.weight_spans)
        for span in sample.weight_spans:
            expected = await anyio.to_thread.run_sync(token_logprobs, weights[span.version], sample)
            got = sample.rollout_log_probs
            assert got is not None
            assert max(abs(got[i] - expected[i]) for i in range(span.start, span.end)) < 1e-4
    assert {s.version for g in after.groups for x in g for s in x.weight_spans} == {"1"}
    assert after.metrics["rollout/staleness_max"] == 0.0


async def test_in_place_marks_tokens_made_on_old_kv_and_new_requests_never_reuse_it(
    tiny_rollout: Open, tmp_path: Path
) -> None:
    config = WeightUpdateConfig(mode=PauseMode.IN_PLACE)
    # 64 tokens (0.64 s): the update lands with most of them to go, even on a loaded
    # machine (with 12, it could land at the last token, which a random tied-embedding
    # model predicts with a log-prob near 0 from any KV).
    sampling = TextSamplingParams(max_new_tokens=64, extra={"ignore_eos": True})
    async with tiny_rollout(n_samples_per_prompt=1, weight_update=config, sampling=sampling) as (
        rollout,
        (engine,),
    ):
        assert engine.model is not None
        old = engine.model.model
        new = await saved(old, tmp_path / "v1", seed=1)
        warm = [await rollout.run(["Say it again:"]) for _ in range(2)]
        result, report = await run_across_update(rollout, engine, tmp_path / "v1", "1")
        again = await rollout.run(["Say it again:"])
        stats = engine.statistics()
    assert report.ok and report.kept_kv and report.flush is None and report.plant is None
    assert (stats.flushes, stats.flush_refusals) == (0, 0)  # never tried: it cannot flush
    (sample,) = result.samples
    first, second = sample.weight_spans
    assert (first.version, second.version, second.kv_version) == ("default", "1", "default")
    got = sample.rollout_log_probs
    assert got is not None
    # Exactly what the new weights give on the KV the old ones made (of every position
    # before the update's first step), and not what they give on their own.
    on_old_kv = await anyio.to_thread.run_sync(in_place_logprobs, old, new, sample, second.start)
    expected = await anyio.to_thread.run_sync(token_logprobs, new, sample)
    span = range(second.start, second.end)
    off_old_kv = max(abs(got[i] - on_old_kv[i - second.start]) for i in span)
    off_new_only = max(abs(got[i] - expected[i]) for i in span)
    print(
        f"in_place: {off_old_kv:.2e} off the old-KV computation, {off_new_only:.2e} off a recompute"
    )
    assert off_old_kv < 1e-4 and off_new_only > 10 * off_old_kv
    # Before the update the prompt's KV was reused; after it, under the new cache key, not.
    cached = [r.samples[0].prefix_cache_info.cached_tokens for r in (*warm, again)]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0
    requests = engine.statistics().requests
    assert "extra_key" not in requests[0] and requests[-1]["extra_key"] == "miles-lite-weights:1"


async def test_check_versions_decides_at_once_for_an_engine_a_catch_up_is_loading(
    tokenizer: Any, tmp_path: Path
) -> None:
    """``router.check_versions()`` while a catch-up is loading weights into a fenced engine
    (each try takes a second here) that meanwhile reports the current version another way:
    it waits for that try to end, then the engine's answer decides (it rejoins at once).
    Before, the engine was left to the catch-up: check_versions said it reports the
    version, and it stayed out until a later health round."""
    configs = (
        TextStandInConfig(token_latency_s=0.01, policy=TinyModelPolicy(seed=0)),
        TextStandInConfig(
            token_latency_s=0.01,
            policy=TinyModelPolicy(seed=0, hidden_size=16),
            update_latency_s=1.0,
        ),
    )
    settings = TextRolloutConfig(
        sampling=LONG,
        engines=EngineConfig(
            # No health round in the test's time: only check_versions can admit it.
            router=RouterConfig(max_inflight_per_engine=8, health_interval_s=60.0),
            client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
        ),
    )
    async with (
        TextStandInEngine(configs[0], tokenizer) as good,
        TextStandInEngine(configs[1], tokenizer) as bad,
        TextRollout.open([good.url, bad.url], tokenizer=tokenizer, config=settings) as rollout,
    ):
        assert good.model is not None
        await saved(good.model.model, tmp_path / "v1", seed=1)  # does not fit hidden size 16
        with pytest.raises(EngineControlError):
            await rollout.update_weights(tmp_path / "v1", version="1")
        # Its catch-up's first try (a second long) is loading; the version comes another way.
        await rollout.router.client.post_json(
            bad.url, "/update_weight_version", {"new_version": "1", "abort_all_requests": False}
        )
        assert await rollout.router.check_versions() == {bad.url: "1"}
        assert rollout.router.healthy_urls == (good.url, bad.url)
        assert rollout.router.statistics().fleet.catch_up_failures == 1  # the try it waited on


async def test_an_engine_that_missed_the_update_leaves_rotation_until_it_reports_it(
    tiny_rollout: Open, tmp_path: Path
) -> None:
    policies = (TinyModelPolicy(seed=0), TinyModelPolicy(seed=0, hidden_size=16))
    async with tiny_rollout(*policies, n_samples_per_prompt=4) as (rollout, engines):
        good, bad = engines
        assert good.model is not None
        await saved(good.model.model, tmp_path / "v1", seed=1)  # does not fit hidden size 16
        with pytest.raises(EngineControlError) as caught:
            await rollout.update_weights(tmp_path / "v1", version="1")
        assert set(caught.value.failures) == {bad.url}
        assert "update_weights_from_disk" in str(caught.value) and "do not fit" in str(caught.value)
        assert rollout.router.healthy_urls == (good.url,)
        assert not bad.paused and not good.paused  # both continued
        served = len(bad.statistics().requests)
        result = await rollout.run(["Count with me:"])
        assert len(bad.statistics().requests) == served  # nothing went to it
        assert {s.version for x in result.samples for s in x.weight_spans} == {"1"}
        # Its weights are brought to version 1 another way: it reports it and comes back.
        await rollout.router.client.post_json(
            bad.url, "/update_weight_version", {"new_version": "1", "abort_all_requests": False}
        )
        assert await rollout.router.check_versions() == {bad.url: "1"}
        assert rollout.router.healthy_urls == (good.url, bad.url)
        with pytest.raises(ConfigError, match="only move forward"):
            await rollout.update_weights(None, version="default")
        report = await rollout.update_weights(None, version="2")  # a bump, both engines
        assert report.ok and report.push.action == "update_weight_version"


async def test_a_cancelled_update_still_lets_every_engine_continue() -> None:
    calls: list[str] = []

    async def handler(request: Request) -> MockResponse:
        calls.append(request.path)
        if request.path == "/update_weights_from_disk":
            await anyio.sleep(30)
        if request.path == "/model_info":
            return MockResponse.json({"weight_version": "default"})
        if request.path in ("/pause_generation", "/continue_generation"):
            return MockResponse.json({"status": "ok"})
        return MockResponse(status=200)

    config = EngineClientConfig(retry=RetryPolicy(max_attempts=1))
    async with (
        EngineClient(config, transport=MockTransport(handler)) as client,
        Router(["http://a"], client, RouterConfig(max_inflight_per_engine=2)) as router,
    ):
        with anyio.move_on_after(0.3):
            await router.update_weights("/ckpt", version="1")
        assert calls[-1] == "/continue_generation"
        async with router.lease() as url:  # the hold ended with it
            assert url == "http://a"
    assert router.versions.current is None  # nothing was recorded
    with pytest.raises(ConfigError, match="str or an int"):
        await router.update_weights(None, version=1.5)  # type: ignore[arg-type]
