from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import torch

from miles_lite.cli import load_function
from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import (
    CodecError,
    EngineProtocolError,
    EngineStatusError,
    GenerateError,
    RewardError,
)
from miles_lite.pools.parser_pool import ParserPool
from miles_lite.pools.reward_pool import RewardPool
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.rollout.groups import PromptGroup
from miles_lite.rollout.result import RolloutResult
from miles_lite.testing import StandInConfig, StandInEngine, synthetic_body, synthetic_sample
from miles_lite.types import Sample, SampleStatus
from tests.support.garbage import collect_garbage

pytestmark = pytest.mark.anyio

PROMPTS = ["a cat", "a dog", "a red fox"]
SAMPLING = DiffusionSamplingParams(num_inference_steps=3)


@asynccontextmanager
async def rollout_over(
    urls: list[str],
    parser: ParserPool | None,
    rewards: Mapping[str, Any],
    **kwargs: Any,
) -> AsyncIterator[DiffusionRollout]:
    config_kwargs = {
        k: kwargs.pop(k) for k in list(kwargs) if k in DiffusionRolloutConfig.__dataclass_fields__
    }
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=config_kwargs.pop("n_samples_per_prompt", 5),
        microgroup_size=config_kwargs.pop("microgroup_size", 2),
        sampling=config_kwargs.pop("sampling", SAMPLING),
        **config_kwargs,
    )
    client_config = EngineClientConfig(retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01))
    router_config = RouterConfig(max_inflight_per_engine=kwargs.pop("max_inflight_per_engine", 4))
    async with (
        EngineClient(client_config) as client,
        Router(urls, client, router_config) as router,
    ):
        yield DiffusionRollout(
            config=config, router=router, parser=parser, rewards=rewards, **kwargs
        )


def expected(
    sample: Sample,
    request_seed: int,
    position: int,
    wire: str = "msgpack",
    config: StandInConfig | None = None,
) -> dict[str, Any]:
    request = {"prompt": sample.prompt, "seed": request_seed, "num_inference_steps": 3}
    return synthetic_sample(
        seed=request_seed,
        sample_index_in_request=position,
        request=request,
        config=config or StandInConfig(wire=wire),
    )


def check_tensors(result: RolloutResult, n: int, microgroup: int, wire: str = "msgpack") -> None:
    for sample in result.samples:
        j = sample.index % n
        position = j % microgroup
        first = result.samples[sample.index - position]  # the microgroup's first sample
        request_seed = first.seed
        assert sample.seed == request_seed + position
        want = expected(sample, request_seed, position, wire)
        assert sample.dit_trajectory is not None
        assert torch.equal(sample.dit_trajectory.latents, want["dit_trajectory"]["latents"])
        assert torch.equal(sample.generated_output, want["generated_output"])
        assert torch.equal(sample.rollout_log_probs, want["rollout_log_probs"])
        assert torch.equal(
            sample.rollout_debug_tensors["rollout_variance_noises"],
            want["rollout_debug_tensors"]["rollout_variance_noises"],
        )
        if wire == "msgpack":
            assert torch.equal(sample.dit_trajectory.sigmas, want["dit_trajectory"]["sigmas"])
        else:
            assert sample.dit_trajectory.sigmas is None


async def test_rollout_over_two_engines_returns_every_sample_from_its_seed(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    urls = [e.url for e in engines]
    async with rollout_over(urls, parser, reward_pools, reward="mean") as rollout:
        result = await rollout.run(PROMPTS)
    assert [s.index for s in result.samples] == list(range(15))
    assert [len(g) for g in result.groups] == [5, 5, 5]
    assert all(s.status is SampleStatus.COMPLETED for s in result.samples)
    check_tensors(result, n=5, microgroup=2)
    for sample in result.samples:
        assert sample.reward == pytest.approx(float(sample.generated_output.float().mean()))
    # 3 microgroups a group (2 + 2 + 1), spread over both engines, num_outputs_per_prompt right.
    assert len(result.spans) == 9 and {s.engine for s in result.spans} == set(urls)
    sizes = sorted(r["num_outputs_per_prompt"] for e in engines for r in e.stats.requests)
    assert sizes == [1, 1, 1, 2, 2, 2, 2, 2, 2]
    for span in result.spans:
        assert span.generate_start <= span.generate_end <= span.deserialize_end <= span.reward_end
    metrics = result.metrics
    assert metrics["perf/rollout_time"] > 0 and metrics["rollout/samples"] == 15
    assert (
        "perf/parser_max_queue_depth" in metrics and "perf/reward_max_queue_depth_mean" in metrics
    )
    assert "perf/reward_max_queue_depth_slow" not in metrics  # pools that did not run: absent


@pytest.mark.parametrize("mode", ["json", "fetch_in_parser", "inline", "inline-json"])
async def test_every_transport_gives_the_same_tensors(
    mode: str, parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    wire = "json" if "json" in mode else "msgpack"
    options: dict[str, Any] = {
        "fetch_in_parser": mode == "fetch_in_parser",
        "transport": "inline" if mode.startswith("inline") else "pool",
    }
    async with (
        StandInEngine(StandInConfig(wire=wire)) as engine,
        rollout_over([engine.url], parser, reward_pools, reward="mean", **options) as rollout,
    ):
        result = await rollout.run(PROMPTS[:2])
    assert not result.failed
    check_tensors(result, n=5, microgroup=2, wire=wire)


async def test_queue_depth_is_zero_when_idle_and_grows_when_the_reward_is_slow(
    parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    async with StandInEngine(StandInConfig(step_latency_s=0.03)) as engine:
        async with rollout_over(
            [engine.url], parser, reward_pools, reward="mean", max_inflight_per_engine=1
        ) as rollout:
            idle = await rollout.run(PROMPTS[:2])
        async with rollout_over(
            [engine.url], parser, reward_pools, reward="slow", max_inflight_per_engine=4
        ) as rollout:
            busy = await rollout.run(PROMPTS)
    assert idle.metrics["perf/parser_max_queue_depth"] == 0
    assert idle.metrics["perf/reward_max_queue_depth_mean"] == 0
    assert busy.metrics["perf/reward_max_queue_depth_slow"] >= 2


async def test_group_reward_sees_whole_groups_and_rm_type_overrides_the_kind(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    prompts = ["a cat", PromptGroup(prompt="a dog", metadata={"rm_type": "minus"})]
    async with rollout_over([engines[0].url], parser, reward_pools, reward="mean") as rollout:
        result = await rollout.run(prompts)
    assert all(s.reward == -1.0 for s in result.groups[1])
    assert all(s.reward != -1.0 for s in result.groups[0])
    async with rollout_over(
        [engines[0].url], parser, reward_pools, group_reward="group"
    ) as rollout:
        grouped = await rollout.run(prompts)
    assert all(s.reward == {"group_size": 5.0, "seed": float(s.seed)} for s in grouped.samples)


async def test_dynamic_filter_drops_groups(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    def keep(group: list[Sample]) -> bool:
        return group[0].prompt != "a dog"

    async with rollout_over([engines[0].url], parser, reward_pools, dynamic_filter=keep) as rollout:
        result = await rollout.run(PROMPTS)
    assert [g[0].prompt for g in result.groups] == ["a cat", "a red fox"]
    assert [g[0].prompt for g in result.filtered] == ["a dog"]
    assert result.metrics["rollout/filtered_groups"] == 1


async def custom_generate(fn_input: GenerateFnInput) -> list[Sample]:
    samples = await generate_diffusion(fn_input)
    for sample in samples:
        sample.metadata["custom"] = True
    return samples


async def test_a_custom_generate_function_by_callable_or_dotted_path(
    engines: list[StandInEngine], parser: ParserPool
) -> None:
    fn = load_function("tests.diffusion.test_diffusion_rollout.custom_generate")
    assert fn is custom_generate
    async with rollout_over([engines[0].url], parser, {}, generate=fn) as rollout:
        result = await rollout.run(PROMPTS[:1])
    assert all(s.metadata["custom"] for s in result.samples)

    async def broken(fn_input: GenerateFnInput) -> list[Sample]:
        raise KeyError("oops")

    async with rollout_over([engines[0].url], parser, {}, generate=broken) as rollout:
        failed = await rollout.run(PROMPTS[:1])
    assert all(isinstance(s.error, GenerateError) for s in failed.samples)


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        ({"status_next": [500]}, EngineStatusError, "500"),
        ({"truncate_body_next": 1}, EngineProtocolError, "truncated"),
        ({"corrupt_body_next": 1}, CodecError, "msgpack"),
    ],
)
@pytest.mark.parametrize("fetch_in_parser", [False, True])
async def test_a_bad_answer_fails_its_microgroup_only(
    engines: list[StandInEngine],
    parser: ParserPool,
    reward_pools: dict[str, RewardPool],
    fault: dict[str, Any],
    error: type[Exception],
    match: str,
    fetch_in_parser: bool,
) -> None:
    engine = engines[0]
    engine.faults.update(fault)
    async with rollout_over(
        [engine.url],
        parser,
        reward_pools,
        reward="mean",
        max_inflight_per_engine=1,
        fetch_in_parser=fetch_in_parser,
    ) as rollout:
        result = await rollout.run(PROMPTS[:2])
    failed = result.failed
    assert len(failed) == 2  # exactly the first microgroup
    for sample in failed:
        assert isinstance(sample.error, error)
        assert match in str(sample.error)
        assert sample.error.url == engine.url and sample.error.request_id
        assert engine.url in str(sample.error)
    assert sum(s.status is SampleStatus.COMPLETED for s in result.samples) == 8
    assert result.metrics["rollout/failed_samples"] == 2
    assert parser.arena is not None
    del result, failed, sample
    await collect_garbage()
    assert parser.arena.used_bytes == 0


async def test_a_503_is_retried_and_succeeds(
    engines: list[StandInEngine], parser: ParserPool
) -> None:
    engines[0].faults.update({"status_next": [503]})
    async with rollout_over([engines[0].url], parser, {}) as rollout:
        result = await rollout.run(PROMPTS[:1])
    assert not result.failed


async def test_a_raising_reward_fails_only_its_samples_naming_engine_and_request(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    async with rollout_over([engines[0].url], parser, reward_pools, reward="dogs") as rollout:
        result = await rollout.run(PROMPTS)
    failed = result.failed
    assert {s.prompt for s in failed} == {"a dog"} and len(failed) == 5
    for sample in failed:
        assert isinstance(sample.error, RewardError)
        assert "no dogs allowed" in str(sample.error)
        assert sample.error.url == engines[0].url and sample.error.request_id
    assert all(s.reward is not None for s in result.samples if s.prompt != "a dog")


async def test_an_unknown_dtype_is_a_codec_error_naming_the_field(
    parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    import msgpack
    from aiohttp import web

    from miles_lite.testing import encode_tensor_map
    from tests.pools.bodies import items

    sample = items(1, n=1)[0]
    sample["generated_output"] = {
        **encode_tensor_map(torch.zeros(2)),
        "dtype": "torch.complex_thing",
    }
    raw = msgpack.packb(
        [{**{k: v for k, v in sample.items() if k != "dit_trajectory"}}],
        default=lambda t: encode_tensor_map(t),
    )

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=raw, content_type="application/msgpack")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/rollout/generate", handle)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        async with rollout_over(
            [url], parser, {}, n_samples_per_prompt=1, microgroup_size=1
        ) as rollout:
            result = await rollout.run(PROMPTS[:1])
    finally:
        await runner.cleanup()
    (sample_out,) = result.failed
    assert isinstance(sample_out.error, CodecError)
    assert "torch.complex_thing" in str(sample_out.error) and "generated_output" in str(
        sample_out.error
    )
    assert sample_out.error.url == url


async def test_a_cancelled_rollout_leaves_nothing_behind(parser: ParserPool) -> None:
    async with StandInEngine(StandInConfig(step_latency_s=0.2)) as engine:
        async with rollout_over([engine.url], parser, {}, fetch_in_parser=True) as rollout:
            with anyio.move_on_after(0.1):
                await rollout.run(PROMPTS)
        await anyio.sleep(1.0)  # answers still arriving are freed as they land
    await collect_garbage()
    assert parser.arena is not None and parser.arena.used_bytes == 0


async def test_tensors_held_across_rollouts_stay_intact_and_released_space_is_reused(
    reward_pools: dict[str, RewardPool],
) -> None:
    # An arena that holds about two rollouts: the first one's tensors, still held, must not
    # be overwritten by the second; once dropped, their space serves a third.
    from miles_lite.pools.arena import ArenaConfig
    from miles_lite.pools.parser_pool import ParserPoolConfig

    engine_config = StandInConfig(latent_height=32, latent_width=32)
    config = ParserPoolConfig(workers=2, arena=ArenaConfig(size_bytes=4 << 20, page_bytes=16 << 10))
    async with StandInEngine(engine_config) as engine, ParserPool(config) as small:
        assert small.arena is not None
        async with rollout_over([engine.url], small, {}, n_samples_per_prompt=2, seed=0) as rollout:
            first = await rollout.run(PROMPTS)
        kept = {s.index: s.dit_trajectory.latents.clone() for s in first.samples}  # type: ignore[union-attr]
        held = small.arena.used_bytes
        assert held > 1 << 20
        async with rollout_over(
            [engine.url], small, {}, n_samples_per_prompt=2, seed=1000
        ) as rollout:
            second = await rollout.run(PROMPTS)
        assert not second.failed
        for sample in first.samples:
            assert torch.equal(sample.dit_trajectory.latents, kept[sample.index])  # type: ignore[union-attr]
        del first, second, sample
        await collect_garbage()
        assert small.arena.used_bytes == 0
        async with rollout_over(
            [engine.url], small, {}, n_samples_per_prompt=2, seed=2000
        ) as rollout:
            third = await rollout.run(PROMPTS)
        assert not third.failed and small.arena.used_bytes <= held + (64 << 10)


async def test_an_api_reward_pool_scores_over_http_within_its_concurrency(
    engines: list[StandInEngine], parser: ParserPool
) -> None:
    from aiohttp import web

    from miles_lite.pools.reward_pool import ApiRewardPool
    from miles_lite.rewards.api_scorer import ApiScorer

    in_flight = peak = 0

    async def score(request: web.Request) -> web.Response:
        nonlocal in_flight, peak
        body = await request.json()
        in_flight += 1
        peak = max(peak, in_flight)
        await anyio.sleep(0.05)
        in_flight -= 1
        return web.json_response({"scores": [len(s["prompt"]) for s in body["samples"]]})

    app = web.Application()
    app.router.add_post("/score", score)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/score"  # type: ignore[union-attr]
    try:
        async with ApiScorer(url, max_concurrency=2) as scorer:
            pool = ApiRewardPool("api", scorer)
            async with rollout_over(
                [e.url for e in engines], parser, {"api": pool}, reward="api"
            ) as rollout:
                result = await rollout.run(PROMPTS)
    finally:
        await runner.cleanup()
    assert not result.failed
    assert [s.reward for s in result.samples] == [float(len(s.prompt)) for s in result.samples]
    assert peak <= 2
    # 9 microgroups at once against 2 slots: calls found others in flight.
    assert result.metrics["perf/reward_max_queue_depth_api"] >= 2


@pytest.mark.parametrize("arena_bytes", [1 << 20, 256 << 10])
@pytest.mark.parametrize("mode", ["pool", "fetch_in_parser", "json"])
async def test_a_full_arena_spills_instead_of_failing(mode: str, arena_bytes: int) -> None:
    # The arena holds one body (or none): the rollout keeps every sample, so later bodies
    # find no room; they go through private memory and the rollout still completes, right.
    from miles_lite.pools.arena import ArenaConfig
    from miles_lite.pools.parser_pool import ParserPoolConfig

    wire = "json" if mode == "json" else "msgpack"
    config = ParserPoolConfig(
        workers=2, arena=ArenaConfig(size_bytes=arena_bytes, page_bytes=4096, wait_s=0.05)
    )
    engine_config = StandInConfig(wire=wire, latent_height=32, latent_width=32)
    async with (
        StandInEngine(engine_config) as engine,
        ParserPool(config) as tiny,
        rollout_over(
            [engine.url],
            tiny,
            {},
            n_samples_per_prompt=2,
            fetch_in_parser=mode == "fetch_in_parser",
        ) as rollout,
    ):
        result = await rollout.run(PROMPTS)
    assert not result.failed
    assert result.metrics["perf/arena_spills"] >= 1
    for sample in result.samples:
        position = sample.index % 2
        want = expected(sample, sample.seed - position, position, wire, engine_config)
        assert torch.equal(sample.dit_trajectory.latents, want["dit_trajectory"]["latents"])  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["pool", "fetch_in_parser", "inline"])
async def test_rollouts_in_a_row_reuse_the_pages_the_user_let_go(mode: str) -> None:
    # The arena holds one rollout's bodies, not two. Once the first rollout's tensors are
    # dropped, the second rollout must find their pages free: with fetch_in_parser only
    # the workers allocate, so the frees queued by the main process's finalizers must
    # reach the shared page table without a main-process allocation to drain them.
    from miles_lite.pools.arena import ArenaConfig
    from miles_lite.pools.parser_pool import ParserPoolConfig

    engine_config = StandInConfig(latent_height=32, latent_width=32)
    body = len(
        synthetic_body(
            {"prompt": "a cat", "seed": 1, "num_inference_steps": 3, "num_outputs_per_prompt": 2},
            engine_config,
        )
    )
    # Three bodies a rollout (3 prompts, 2 samples, microgroups of 2), with page slack.
    arena = ArenaConfig(size_bytes=4 * body + (64 << 10), page_bytes=4096, wait_s=2.0)
    async with (
        StandInEngine(engine_config) as engine,
        ParserPool(ParserPoolConfig(workers=2, arena=arena)) as pool,
    ):
        for attempt in range(3):
            async with rollout_over(
                [engine.url],
                pool if mode != "inline" else None,
                {},
                n_samples_per_prompt=2,
                fetch_in_parser=mode == "fetch_in_parser",
                transport="inline" if mode == "inline" else "pool",
                arena=pool.arena,
            ) as rollout:
                result = await rollout.run(PROMPTS)
            assert not result.failed
            assert result.metrics["perf/arena_spills"] == 0, attempt
            assert result.metrics["perf/pickled_bytes"] == 0, attempt
            for sample in result.samples:
                # Adopted in place: every tensor views the arena.
                assert pool.arena.tensor_ref(sample.dit_trajectory.latents) is not None  # type: ignore[union-attr]
            del result, sample
            await collect_garbage()
