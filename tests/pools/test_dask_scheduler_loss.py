"""DaskRewardPool when the cluster's scheduler process is SIGKILLed mid-rollout (issue 30
D3): every sample whose reward could not be computed is FAILED with a RewardError naming
the pool and the cause, counted in the metrics, and the result's summary says so; the
run returns, nothing is left partial, no cancellation leaks out of the pool."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.errors import RewardError, WorkerError
from miles_lite.pools import DaskRewardPool
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextStandInConfig, TextStandInEngine
from miles_lite.types import Sample, SampleStatus
from tests.pools import dask_rewards
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def cluster_processes(directory: Path) -> AsyncIterator[tuple[str, Process]]:
    """A scheduler and one single-thread worker, each a process of its own (a LocalCluster
    keeps its scheduler in this process, where it cannot be killed): the scheduler's
    address and its process. Both are SIGKILLed on the way out."""
    file = directory / "scheduler.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0",
    }
    quiet = {"cwd": ROOT, "env": env, "stdout": DEVNULL, "stderr": DEVNULL}
    scheduler_cli = ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0"]
    scheduler_cli += ["--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(file)]
    worker_cli = ["distributed.cli.dask_worker", "--scheduler-file", str(file)]
    worker_cli += ["--nthreads", "1", "--no-nanny", "--no-dashboard"]
    worker_cli += ["--local-directory", str(directory)]
    scheduler = await anyio.open_process([sys.executable, "-m", *scheduler_cli], **quiet)  # type: ignore[arg-type]
    worker: Process | None = None
    try:
        await wait_until(lambda: file.exists() and file.stat().st_size > 0, timeout_s=60)
        address = json.loads(file.read_text())["address"]
        worker = await anyio.open_process([sys.executable, "-m", *worker_cli], **quiet)  # type: ignore[arg-type]
        yield address, scheduler
    finally:
        with anyio.CancelScope(shield=True):
            for process in (worker, scheduler):
                if process is not None:
                    if process.returncode is None:
                        process.kill()
                    await process.wait()


async def test_a_scheduler_killed_mid_rollout_fails_the_unscored_samples_typed(
    tmp_path: Path, tokenizer: Any
) -> None:
    pidfile = tmp_path / "victim.pid"
    prompts: list[Any] = [f"Say {i}." for i in range(8)]
    prompts[3] = PromptGroup(prompt="Say victim.", label=str(pidfile))
    config = TextRolloutConfig(
        n_samples_per_prompt=2, reward="slow", sampling=TextSamplingParams(max_new_tokens=4)
    )
    async with cluster_processes(tmp_path) as (address, scheduler):
        pool = DaskRewardPool(
            "slow", dask_rewards.slow_unless_victim, address=address, connect_timeout_s=30
        )

        async def kill_the_scheduler() -> None:
            # The victim's call is running on the worker: calls are in flight.
            await wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout_s=60)
            scheduler.kill()  # SIGKILL
            await scheduler.wait()

        async with (
            TextStandInEngine(TextStandInConfig(), tokenizer) as engine,
            pool,
            TextRollout.open(
                [engine.url], tokenizer=tokenizer, config=config, rewards={"slow": pool}
            ) as rollout,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(kill_the_scheduler)
            with anyio.fail_after(120):
                result = await rollout.run(prompts)
            # Later calls fail at once, typed, while the scheduler is gone.
            sample = Sample(index=0, group_index=0, prompt="p", response="r", tokens=[1])
            with pytest.raises(RewardError, match="scheduler") as later:
                await pool.score([sample])
            stats = pool.statistics()
    assert scheduler.returncode == -signal.SIGKILL
    assert isinstance(later.value.__cause__, WorkerError)
    # Every group came back whole: nothing partial, every sample scored or FAILED.
    assert not result.partial and len(result.groups) == 8
    failed = result.failed
    assert failed, "the victim's sample at least could not be scored"
    for sample in failed:
        error = sample.error
        assert isinstance(error, RewardError)
        assert "'slow'" in str(error) and address in str(error)  # the pool, where
        assert isinstance(error.__cause__, WorkerError)
        assert "scheduler" in str(error.__cause__)  # the cause
    victim = [s for s in result.samples if s.prompt == "Say victim."]
    assert {s.status for s in victim} == {SampleStatus.FAILED}
    scored = [s for s in result.samples if s.status is not SampleStatus.FAILED]
    assert all(s.reward == 1.0 for s in scored)  # scored before the kill
    assert len(scored) + len(failed) == 16
    assert result.metrics["rollout/failed_samples"] == float(len(failed))
    assert f"({len(failed)} sample" in result.summary()  # the run says so
    # Failed calls: at least the victim's in the run and the one after it.
    assert stats.failures >= 2 and stats.calls >= stats.failures
