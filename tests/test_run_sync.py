"""run_sync runs a script's entry point, and refuses at once where a loop already runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from miles_lite import run_sync
from miles_lite.errors import EventLoopError


async def where(x: int) -> tuple[int, str]:
    await anyio.lowlevel.checkpoint()
    return x * 2, threading.current_thread().name


def test_run_sync_from_plain_code_runs_here() -> None:
    assert run_sync(where, 2) == (4, threading.current_thread().name)


def test_run_sync_inside_a_running_loop_refuses_at_once_and_says_await() -> None:
    # A synchronous call made while this thread's loop runs, as in a Jupyter cell: waiting
    # would block the loop (and hang whatever it serves), so it is refused.
    async def notebook_cell() -> None:
        run_sync(where, 3)

    started = time.monotonic()
    with pytest.raises(EventLoopError, match=r"use `await where\(\.\.\.\)` here") as caught:
        asyncio.run(notebook_cell())
    assert time.monotonic() - started < 5
    assert isinstance(caught.value, RuntimeError) and "\n" not in str(caught.value)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_script_without_main_guard_runs_a_main_defined_reward_in_the_pool(
    start_method: str, tmp_path: Path
) -> None:
    # Python 3.14 makes forkserver the default on Linux: a function defined in __main__
    # cannot be unpickled by reference there (nor under spawn). The pools send it by
    # value, and no worker or stand-in process re-runs the script (no __main__ guard here).
    script = textwrap.dedent(
        f"""
        from miles_lite import DiffusionRollout, DiffusionRolloutConfig, run_sync
        from miles_lite.pools.reward_pool import RewardPool
        from miles_lite.testing import EngineProcessGroup, StandInConfig


        def prompt_length(samples):
            return [float(len(s.prompt)) for s in samples]


        async def rollout(urls):
            config = DiffusionRolloutConfig(n_samples_per_prompt=2, microgroup_size=1, reward="len")
            async with RewardPool("len", prompt_length, start_method={start_method!r}) as pool:
                async with DiffusionRollout.open(urls, config=config, rewards={{"len": pool}}) as r:
                    result = await r.run(["a cat", "a horse"])
            return [s.reward for s in result.samples], [s.status.value for s in result.samples]


        with EngineProcessGroup([StandInConfig(latent_height=8, latent_width=8)]) as engines:
            print(run_sync(rollout, engines.urls))
        """
    )
    path = tmp_path / "job.py"  # a file: spawn re-runs a main script it can find
    path.write_text(script)
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(([5.0, 5.0, 7.0, 7.0], ["completed"] * 4))
    assert "Traceback" not in out.stderr
