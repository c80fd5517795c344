"""Oversampled diffusion rollouts over loopback engines with real pools: early stop, bounds, leaks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psutil
import pytest

from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.errors import FilterError
from miles_lite.pools.parser_pool import ParserPool
from miles_lite.pools.reward_pool import RewardPool
from miles_lite.rollout.filters import FilterResult
from miles_lite.testing import StandInConfig, StandInEngine
from miles_lite.types import Sample, SampleStatus
from tests.support.garbage import collect_garbage

pytestmark = pytest.mark.anyio

PROMPTS = [f"prompt {i}" for i in range(8)]


@asynccontextmanager
async def oversampled(
    urls: list[str], parser: ParserPool, rewards: dict[str, Any], **config: Any
) -> AsyncIterator[DiffusionRollout]:
    router_config = RouterConfig(max_inflight_per_engine=config.pop("max_inflight_per_engine", 2))
    filters = config.pop("dynamic_filter", None)
    rollout_config = DiffusionRolloutConfig(
        n_samples_per_prompt=4,
        microgroup_size=2,
        sampling=DiffusionSamplingParams(num_inference_steps=2),
        **config,
    )
    client_config = EngineClientConfig(retry=RetryPolicy(max_attempts=1))
    async with (
        EngineClient(client_config) as client,
        Router(urls, client, router_config) as router,
    ):
        yield DiffusionRollout(
            config=rollout_config,
            router=router,
            parser=parser,
            rewards=rewards,
            dynamic_filter=filters,
        )


def prompts_sent(engines: list[StandInEngine]) -> set[str]:
    return {r["prompt"] for e in engines for r in e.stats.requests}


def drop_prompt_1(group: list[Sample]) -> FilterResult:
    return FilterResult(group[0].prompt != "prompt 1", "unwanted")


async def test_keeps_exactly_the_target_and_never_sends_groups_it_does_not_need(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    urls = [e.url for e in engines]
    async with oversampled(
        urls,
        parser,
        reward_pools,
        reward="mean",
        rollout_batch_size=2,
        over_sampling_batch_size=2,
        dynamic_filter=drop_prompt_1,
    ) as rollout:
        result = await rollout.run(PROMPTS)
    assert len(result.groups) == 2
    assert all(s.status is SampleStatus.COMPLETED and s.reward is not None for s in result.samples)
    assert result.metrics["rollout/dynamic_filter/drop_unwanted"] == 1
    kept = {g[0].prompt for g in result.groups}
    started = kept | {"prompt 1"} | {g[0].prompt for g in result.partial if g[0].request_id}
    # Prompt 1 was dropped, so one more batch of two started; the last four never went out.
    assert prompts_sent(engines) <= {f"prompt {i}" for i in range(4)}
    assert prompts_sent(engines) >= kept
    assert {g[0].prompt for g in result.partial} >= {f"prompt {i}" for i in range(4, 8)}
    assert started <= {f"prompt {i}" for i in range(4)}


async def test_the_stop_is_bounded_when_one_engine_never_answers(
    parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    async with StandInEngine(StandInConfig()) as good, StandInEngine(StandInConfig()) as dead:
        dead.faults.update({"stall_next": 1000})  # accepts the request, never answers
        tasks_before = len(asyncio.all_tasks())
        connections_before = len(psutil.Process().net_connections())
        async with oversampled(
            [good.url, dead.url],
            parser,
            reward_pools,
            reward="mean",
            rollout_batch_size=1,
            over_sampling_batch_size=4,
            stop_timeout_s=0.5,
        ) as rollout:
            with anyio.fail_after(30):
                result = await rollout.run(PROMPTS[:4])
        assert len(result.groups) == 1 and len(result.partial) == 3
        assert result.metrics["perf/stop_time"] < 2.0
        # The stalled requests were cancelled: nothing of the rollout is left behind.
        del result
        await collect_garbage()
        assert parser.arena is not None and parser.arena.used_bytes == 0
        assert len(asyncio.all_tasks()) <= tasks_before
    # Both engines closed: our sockets to them are gone too.
    assert len(psutil.Process().net_connections()) <= connections_before


async def test_a_filter_that_raises_fails_its_group_only(
    engines: list[StandInEngine], parser: ParserPool, reward_pools: dict[str, RewardPool]
) -> None:
    def fragile(group: list[Sample]) -> bool:
        if group[0].prompt == "prompt 2":
            raise RuntimeError("filter bug")
        return True

    async with oversampled(
        [engines[0].url], parser, reward_pools, reward="mean", dynamic_filter=fragile
    ) as rollout:
        result = await rollout.run(PROMPTS[:4])
    assert [g[0].prompt for g in result.groups] == ["prompt 0", "prompt 1", "prompt 3"]
    (broken,) = result.filtered
    assert result.filter_reasons == ["drop_filter_error"]
    assert all(isinstance(s.error, FilterError) for s in broken)


async def test_two_rollouts_draw_new_seeds_and_a_rollout_id_reproduces_them(
    engines: list[StandInEngine], parser: ParserPool
) -> None:
    async with oversampled([engines[0].url], parser, {}) as rollout:
        first = await rollout.run(PROMPTS[:2])
        second = await rollout.run(PROMPTS[:2])
        again = await rollout.run(PROMPTS[:2], rollout_id=first.rollout_id)
    seeds = [[s.seed for s in r.samples] for r in (first, second, again)]
    assert seeds[0] != seeds[1] and not set(seeds[0]) & set(seeds[1])
    assert seeds[2] == seeds[0]
    assert first.rollout_id != second.rollout_id


async def test_a_responses_arena_space_is_freed_when_all_its_samples_are_detached(
    engines: list[StandInEngine], parser: ParserPool
) -> None:
    # One response (a microgroup of 2) lies in one arena region: the documented lifetime
    # is the response's, so one sample kept pins it and detaching all frees it.
    assert parser.arena is not None
    await collect_garbage()
    before = parser.arena.used_bytes
    async with oversampled([engines[0].url], parser, {}) as rollout:
        result = await rollout.run(PROMPTS[:1])
    first, second = result.samples[:2]
    del result
    await collect_garbage()
    held = parser.arena.used_bytes
    assert held > before
    first.detach_tensors()
    await collect_garbage()
    assert parser.arena.used_bytes == held  # `second` still views the response
    assert first.generated_output is not None  # the copy stays usable
    second.detach_tensors()
    await collect_garbage()
    assert parser.arena.used_bytes == before
