"""Soak: many diffusion rollouts in one process while engines and pool workers are killed.

Between rollouts, at random: an engine is killed (SIGKILL) and restarted on the same port
later, or a parser worker is killed. Each rollout prints samples in / out / failed, and the
process's RSS, open fds, child processes and arena bytes in use, so that a leak shows as a
trend. The last line is one JSON object (the figures of every rollout and a summary).

    python benchmarks/soak.py            # 50 rollouts
    python benchmarks/soak.py --quick    # 8 rollouts, under a minute

Everything runs on 127.0.0.1 with stand-in engines in child processes. Not a test: its
timing depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.to_thread
import psutil

from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.testing import EngineProcess, StandInConfig

ENGINES = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Engines:
    """Stand-in engines on fixed ports, so that a restarted one keeps its URL."""

    def __init__(self, count: int, step_latency_s: float) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.step_latency_s = step_latency_s
        self.procs: list[EngineProcess | None] = [None] * count
        self.kills = 0
        self.restarts = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def _start(self, i: int) -> None:
        config = StandInConfig(port=self.ports[i], step_latency_s=self.step_latency_s)
        proc = EngineProcess(config)
        proc.start()
        self.procs[i] = proc

    async def start_all(self) -> None:
        for i in range(len(self.ports)):
            await anyio.to_thread.run_sync(self._start, i)

    async def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is None or proc.pid is None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        await anyio.to_thread.run_sync(proc.stop)  # reaps the child
        self.procs[i] = None
        self.kills += 1

    async def restart(self, i: int) -> None:
        if self.procs[i] is None:
            await anyio.to_thread.run_sync(self._start, i)
            self.restarts += 1

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc is not None:
                await anyio.to_thread.run_sync(proc.stop)


def pool_worker_pids(engine_pids: set[int]) -> list[int]:
    """Our pool workers: forked by the forkserver (a direct child), so its children."""
    pids = []
    for child in psutil.Process().children():
        if child.pid in engine_pids:
            continue
        try:
            if "forkserver" in " ".join(child.cmdline()):
                pids.extend(worker.pid for worker in child.children())
        except psutil.Error:
            continue
    return pids


def process_figures(arena_bytes: int | None) -> dict[str, Any]:
    me = psutil.Process()
    return {
        "rss_mb": round(me.memory_info().rss / 2**20, 1),
        "fds": me.num_fds(),
        "children": len(me.children(recursive=True)),
        "arena_bytes": arena_bytes,
    }


async def soak(rollouts: int, prompts: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    engines = Engines(ENGINES, step_latency_s=0.005)
    await engines.start_all()
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=4,
        microgroup_size=2,
        sampling=DiffusionSamplingParams(num_inference_steps=2),
        transport="pool",
        engines=EngineConfig(
            client=EngineClientConfig(
                read_timeout_s=20.0,
                total_timeout_s=60.0,
                retry=RetryPolicy(max_attempts=4, backoff_initial_s=0.05, backoff_max_s=0.5),
            ),
            router=RouterConfig(
                max_inflight_per_engine=4,
                health_interval_s=0.2,
                failure_threshold=2,
                wait_timeout_s=10.0,
                readmit_cooldown_s=0.5,
            ),
        ),
    )
    rows: list[dict[str, Any]] = []
    worker_kills = 0
    try:
        async with AsyncExitStack() as stack:
            rollout = await stack.enter_async_context(
                DiffusionRollout.open(engines.urls, config=config)
            )
            arena = rollout.context.arena
            for r in range(rollouts):
                event = "none"
                roll = rng.random()
                down = [i for i, p in enumerate(engines.procs) if p is None]
                if down and roll < 0.4:
                    await engines.restart(rng.choice(down))
                    event = "engine restarted"
                elif roll < 0.25 and len(down) < ENGINES - 1:
                    up = [i for i, p in enumerate(engines.procs) if p is not None]
                    await engines.kill(rng.choice(up))
                    event = "engine killed"
                elif roll < 0.6:
                    engine_pids = {p.pid for p in engines.procs if p is not None and p.pid}
                    workers = pool_worker_pids(engine_pids)
                    event = "no worker found"
                    if workers:
                        os.kill(rng.choice(workers), signal.SIGKILL)
                        worker_kills += 1
                        event = "worker killed"
                started = time.monotonic()
                result = await rollout.run([f"soak {r} prompt {i}" for i in range(prompts)])
                row = {
                    "rollout": r,
                    "event": event,
                    "samples_in": prompts * config.n_samples_per_prompt,
                    "samples_out": len(result.samples),
                    "failed": len(result.failed),
                    "seconds": round(time.monotonic() - started, 2),
                }
                del result  # its tensors hold arena pages: measure what outlives it
                row.update(process_figures(arena.used_bytes if arena is not None else None))
                rows.append(row)
                print(
                    f"rollout {r:3d} {event:17s} in {row['samples_in']:3d}"
                    f" out {row['samples_out']:3d} failed {row['failed']:3d}"
                    f" {row['seconds']:6.2f} s rss {row['rss_mb']:7.1f} MB fds {row['fds']:4d}"
                    f" children {row['children']:3d} arena {row['arena_bytes']}",
                    flush=True,
                )
    finally:
        await engines.stop_all()
    half = rows[len(rows) // 2 :] or rows
    return {
        "rollouts": len(rows),
        "engine_kills": engines.kills,
        "engine_restarts": engines.restarts,
        "worker_kills": worker_kills,
        "samples_in": sum(r["samples_in"] for r in rows),
        "samples_out": sum(r["samples_out"] for r in rows),
        "failed": sum(r["failed"] for r in rows),
        "rss_mb_first_last": [rows[0]["rss_mb"], rows[-1]["rss_mb"]] if rows else None,
        "fds_range_second_half": [min(r["fds"] for r in half), max(r["fds"] for r in half)]
        if rows
        else None,
        "arena_bytes_after_each": [r["arena_bytes"] for r in rows],
        "after_close": process_figures(None),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 rollouts (under a minute)")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rollouts = args.rollouts or (8 if args.quick else 50)
    summary = anyio.run(soak, rollouts, args.prompts, args.seed)
    print(json.dumps(summary, separators=(",", ":")))
    balanced = summary["samples_out"] == summary["samples_in"]
    return 0 if balanced else 1


if __name__ == "__main__":
    sys.exit(main())
