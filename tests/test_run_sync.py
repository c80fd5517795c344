from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import anyio
import anyio.lowlevel

from miles_lite import run_sync


async def where(x: int) -> tuple[int, str]:
    await anyio.lowlevel.checkpoint()
    return x * 2, threading.current_thread().name


def test_run_sync_from_plain_code_runs_here() -> None:
    assert run_sync(where, 2) == (4, threading.current_thread().name)


def test_run_sync_inside_a_running_loop_uses_a_fresh_loop() -> None:
    async def notebook_cell() -> tuple[int, str]:
        # A synchronous call made while this thread's loop runs, as in a Jupyter cell.
        return run_sync(where, 3)

    value, thread = asyncio.run(notebook_cell())
    assert value == 6 and thread.startswith("miles-lite-run-sync")


def test_a_diffusion_rollout_from_a_notebook_loop_with_a_main_defined_reward() -> None:
    # A script whose reward function lives in __main__, run while a loop is already
    # running (what a notebook does): both must work.
    script = textwrap.dedent(
        """
        import asyncio

        from miles_lite import DiffusionRollout, DiffusionRolloutConfig, run_sync
        from miles_lite.testing import StandInEngine


        def prompt_length(samples):
            return [float(len(s.prompt)) for s in samples]


        async def rollout():
            async with StandInEngine() as engine:
                config = DiffusionRolloutConfig(n_samples_per_prompt=2, microgroup_size=1, reward="len")
                async with DiffusionRollout.open(
                    [engine.url], config=config, rewards={"len": prompt_length}
                ) as r:
                    result = await r.run(["a cat", "a horse"])
            return [s.reward for s in result.samples], [s.status.value for s in result.samples]


        async def notebook():
            return run_sync(rollout)


        print(asyncio.run(notebook()))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(([5.0, 5.0, 7.0, 7.0], ["completed"] * 4))
