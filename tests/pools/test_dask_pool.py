"""DaskRewardPool on a real LocalCluster of worker processes (checked by process id): the
same scores as the local pool, errors typed, a worker killed mid-rollout, and the
diffusion hand-off (bytes travel to remote workers; the local pool stays zero-copy)."""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import dask
import pytest
from distributed import Client, LocalCluster

from miles_lite import (
    DiffusionRollout,
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    TextRollout,
    TextRolloutConfig,
    TextSamplingParams,
)
from miles_lite.errors import (
    ClosedResourceError,
    ConfigError,
    RewardError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
)
from miles_lite.pools import ArenaConfig, DaskRewardPool, ParserPoolConfig, RewardPool
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import StandInConfig, StandInEngine, TextStandInConfig, TextStandInEngine
from miles_lite.types import Sample, SampleStatus
from tests.pools import dask_rewards

pytestmark = pytest.mark.anyio


@contextmanager
def local_cluster(directory: Path) -> Iterator[LocalCluster]:
    """Two single-thread worker processes; a task on a worker that dies fails at once
    (allowed-failures 0) and only the running one (worker-saturation 1.0)."""
    settings = {
        "distributed.scheduler.allowed-failures": 0,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with dask.config.set(settings):
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            # The scheduler's HTTP server would take port 8787 (or warn) otherwise.
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.CRITICAL,
            local_directory=str(directory),
        )
    try:
        yield cluster
    finally:
        # Killing the workers first: a close with a task still running waits 4 s.
        for pid in worker_pids(cluster):
            os.kill(pid, signal.SIGKILL)
        cluster.close()


def worker_pids(cluster: LocalCluster) -> set[int]:
    return {n.process.pid for n in cluster.workers.values() if n.process and n.process.pid}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("dask")) as made:
        yield made


async def test_a_text_rollout_scored_on_the_cluster_gets_the_local_pools_scores(
    cluster: LocalCluster, tokenizer: Any
) -> None:
    config = TextRolloutConfig(
        n_samples_per_prompt=2, reward="score", sampling=TextSamplingParams(max_new_tokens=8)
    )
    prompts = [f"Count to {i}." for i in range(6)]
    async with (
        TextStandInEngine(TextStandInConfig(), tokenizer) as engine,
        DaskRewardPool(
            "score", dask_rewards.response_score, address=cluster.scheduler_address
        ) as remote,
        TextRollout.open(
            [engine.url], tokenizer=tokenizer, config=config, rewards={"score": remote}
        ) as rollout,
    ):
        result = await rollout.run(prompts)
        async with RewardPool("score", dask_rewards.response_score) as local:
            local_scores = await local.score(result.samples)
        stats = remote.statistics()
    samples = result.samples
    assert len(samples) == 12 and not result.failed
    remote_scores: list[Any] = [s.reward for s in samples]
    assert [r["score"] for r in remote_scores] == [r["score"] for r in local_scores]  # type: ignore[index]
    # Scored in the cluster's worker processes, not here nor in a local pool's.
    pids = {int(r["pid"]) for r in remote_scores}
    assert pids <= worker_pids(cluster) and os.getpid() not in pids
    assert not pids & {int(r["pid"]) for r in local_scores}  # type: ignore[index]
    assert (stats.calls, stats.failures, stats.tensor_bytes_sent) == (12, 0, 0)
    assert "perf/reward_max_queue_depth_score" in result.metrics


async def test_failures_are_typed_and_the_pool_goes_on(cluster: LocalCluster) -> None:
    client = await anyio.to_thread.run_sync(
        lambda: Client(cluster, set_as_default=False, timeout=30)
    )
    sample = Sample(index=0, group_index=0, prompt="p", response="r", tokens=[1, 2])
    try:
        executor = client.get_executor(pure=False)
        async with (
            DaskRewardPool("boom", dask_rewards.raises, executor=executor) as boom,
            DaskRewardPool("slow", dask_rewards.sleeps, executor=executor, timeout_s=0.3) as slow,
            DaskRewardPool("ok", dask_rewards.Loaded(), executor=executor) as loaded,
        ):
            with pytest.raises(RewardError, match="cannot score 1 samples") as caught:
                await boom.score([sample])
            cause = caught.value.__cause__
            assert isinstance(cause, WorkerTaskError)
            assert "dask_rewards.py" in cause.remote_traceback  # the worker's frames
            with pytest.raises(RewardError, match=r"timeout of 0\.3 s"):
                await slow.score([sample])
            # The function is loaded once per worker process, its load() run there.
            scores: list[Any] = [(await loaded.score([sample]))[0] for _ in range(6)]
            assert {s["loads"] for s in scores} == {1.0}
            assert {int(s["pid"]) for s in scores} <= worker_pids(cluster)
            assert (boom.statistics().failures, slow.statistics().timeouts) == (1, 1)
        with pytest.raises(ClosedResourceError):
            await loaded.score([sample])
    finally:
        await anyio.to_thread.run_sync(client.close)


async def test_a_bad_address_or_both_sources_are_refused() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        DaskRewardPool("r", dask_rewards.raises)
    with pytest.raises(WorkerError, match=r"tcp://127\.0\.0\.1:9"):
        async with DaskRewardPool(
            "r", dask_rewards.raises, address="tcp://127.0.0.1:9", connect_timeout_s=0.5
        ):
            pass


async def test_a_worker_killed_mid_rollout_fails_only_its_call(
    tmp_path: Path, tokenizer: Any
) -> None:
    pidfile = tmp_path / "victim.pid"
    prompts: list[Any] = [f"Say {i}." for i in range(8)]
    prompts[3] = PromptGroup(prompt="Say victim.", label=str(pidfile))
    config = TextRolloutConfig(
        n_samples_per_prompt=1, reward="slow", sampling=TextSamplingParams(max_new_tokens=4)
    )
    killed: list[int] = []

    async def kill_the_victims_worker() -> None:
        with anyio.fail_after(60):
            while not pidfile.exists() or not pidfile.read_text():  # noqa: ASYNC110
                await anyio.sleep(0.02)
        killed.append(int(pidfile.read_text()))
        os.kill(killed[0], signal.SIGKILL)

    with local_cluster(tmp_path / "dask") as cluster:
        before = worker_pids(cluster)
        pool = DaskRewardPool(
            "slow", dask_rewards.slow_unless_victim, address=cluster.scheduler_address
        )
        async with (
            TextStandInEngine(TextStandInConfig(), tokenizer) as engine,
            pool,
            TextRollout.open(
                [engine.url], tokenizer=tokenizer, config=config, rewards={"slow": pool}
            ) as rollout,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(kill_the_victims_worker)
            result = await rollout.run(prompts)
            # The pool goes on: the cluster replaced the worker, calls succeed.
            sample = Sample(index=0, group_index=0, prompt="p", response="r", tokens=[1])
            assert await pool.score([sample]) == [1.0]
            stats = pool.statistics()
    assert killed and killed[0] in before
    victim = next(s for s in result.samples if s.prompt == "Say victim.")
    assert victim.status is SampleStatus.FAILED and isinstance(victim.error, RewardError)
    assert isinstance(victim.error.__cause__, WorkerCrashedError)
    # Only calls on the dead worker failed, each with the crash as the cause.
    for sample in result.failed:
        assert isinstance(sample.error, RewardError)
        assert isinstance(sample.error.__cause__, WorkerCrashedError)
    scored = [s for s in result.samples if s.status is not SampleStatus.FAILED]
    assert len(scored) >= 6 and all(s.reward == 1.0 for s in scored)
    assert stats.crashes == len(result.failed) >= 1


async def test_diffusion_outputs_travel_as_bytes_to_the_cluster_and_stay_in_place_locally(
    cluster: LocalCluster,
) -> None:
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=4,
        microgroup_size=2,
        reward="mean",
        sampling=DiffusionSamplingParams(num_inference_steps=3),
        parser=ParserPoolConfig(
            workers=1, arena=ArenaConfig(size_bytes=64 << 20, page_bytes=16 << 10)
        ),
    )
    prompts = ["a cat", "a dog"]
    async with StandInEngine(StandInConfig(step_latency_s=0.001)) as engine:
        # Locally: a pool of the rollout's own, on the parser's arena.
        async with DiffusionRollout.open(
            [engine.url], config=config, rewards={"mean": dask_rewards.output_mean}
        ) as rollout:
            local = await rollout.run(prompts, rollout_id=0)
            local_stats = rollout.rewards["mean"].statistics()  # type: ignore[attr-defined]
        async with (
            DaskRewardPool(
                "mean", dask_rewards.output_mean, address=cluster.scheduler_address
            ) as remote,
            DiffusionRollout.open([engine.url], config=config, rewards={"mean": remote}) as rollout,
        ):
            far = await rollout.run(prompts, rollout_id=0)
            remote_stats = remote.statistics()
    assert not local.failed and not far.failed and len(far.samples) == 8
    for near, away in zip(local.samples, far.samples, strict=True):
        assert near.reward == away.reward and near.reward is not None
        want = float(away.generated_output.float().mean())  # type: ignore[union-attr]
        assert math.isclose(away.reward, want)  # type: ignore[arg-type]
    output_bytes = sum(
        s.generated_output.element_size() * s.generated_output.numel()  # type: ignore[union-attr]
        for s in far.samples
    )
    # Zero-copy locally (the worker reads the arena); the outputs' bytes, and only they,
    # travel to the cluster (trajectories and debug tensors are left behind).
    assert local_stats.tensor_bytes_sent == 0 and local_stats.calls == 4
    assert remote_stats.tensor_bytes_sent == output_bytes > 0
