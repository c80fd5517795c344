"""Past one machine, side by side in one run: the text layer through SGLang's router
(``smg``) against the built-in router, and a 50 ms reward on the local pool against a Dask
cluster.

    python benchmarks/scale.py --quick     # about a minute
    python benchmarks/scale.py             # the default workload
    python benchmarks/scale.py --help      # every size and count is a flag

Needs ``pip install smg==1.13.0`` (the router; ``dask[distributed]`` is a dev dependency).
Every server runs in a process of its own, as on separate hosts: two fast mock engines
(``text_mock.py``) behind an ``smg`` router launched with miles_lite's flags, a Dask
scheduler and two single-thread workers (``dask scheduler`` / ``dask worker``). Modes:

- ``direct@C`` / ``smg@C``: ``TextRollout`` single turn, C requests in flight over the two
  engines, through the built-in router, then through smg (same load, same engines);
- ``latency-direct@C`` / ``latency-smg@C``: the same over engines holding each request
  ``tokens x latency``: added latency (end to end minus the engines' service time);
- ``reward-local`` / ``reward-dask``: calls of a reward that sleeps 50 ms, 4 in flight on
  two workers (a local ``RewardPool``, a ``DaskRewardPool``), then one at a time.

Measured (best of ``--repeats`` runs per mode: other processes only slow a run down):
requests (calls)/s, main-process CPU per request (every thread of it: aiohttp's, the
Dask client's), latency p50/p99. Checked: token ids and log-probs equal the mocks' ground
truth, no rid served twice, both pools return the same scores. Prints a table and one
JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_layer import Measure, check, mock_reset, mock_stats, token_groups
from text_mock import MockProcess

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine.config import (
    EngineClientConfig,
    EngineConfig,
    RetryPolicy,
    RouterConfig,
    SmgConfig,
)
from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.pools import DaskRewardPool, RewardPool
from miles_lite.testing import SmgRouter
from miles_lite.types import Sample

REWARD_S = 0.05


@asynccontextmanager
async def timed(mode: str) -> AsyncIterator[Measure]:
    """Wall time and main-process CPU (every thread: aiohttp's, the Dask client's) of the
    block; no lag ticker here, whose own wake-ups would count as CPU per request."""
    m = Measure(mode, "", 0, 0.0, 0, 0.0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        yield m
    finally:
        m.seconds = time.perf_counter() - t0
        m.cpu_s = time.process_time() - cpu0


async def best_pair(
    repeats: int, first: Callable[[], Awaitable[Measure]], second: Callable[[], Awaitable[Measure]]
) -> tuple[Measure, Measure]:
    """The fastest of ``repeats`` runs of each, run in turns (first, second, first...):
    other processes on a shared machine only ever slow a run down."""
    a: list[Measure] = []
    b: list[Measure] = []
    for _ in range(repeats):
        a.append(await first())
        b.append(await second())
    return max(a, key=lambda m: m.rps), max(b, key=lambda m: m.rps)


def reward_50ms(samples: list[Sample]) -> list[float]:
    """The heavy reward stand-in: 50 ms of wall time per call (a reward model, a sandbox)."""
    time.sleep(REWARD_S)
    return [float(len(s.tokens) % 7) for s in samples]


def engines(concurrency: int, front: bool) -> EngineConfig:
    """``concurrency`` requests in flight over two engines, directly or through smg (one
    front whose bound is max_inflight_per_engine x its two engines): the same load."""
    per_engine = max(1, concurrency // 2)
    smg = SmgConfig(min_workers=2) if front else None
    return EngineConfig(
        router=RouterConfig(max_inflight_per_engine=per_engine, smg=smg),
        client=EngineClientConfig(
            retry=RetryPolicy(max_attempts=1), max_connections=4096, max_connections_per_host=4096
        ),
    )


async def rollout_generate(
    urls: list[str],
    config: EngineConfig,
    n_requests: int,
    n: int,
    prompt_tokens: int,
    mode: str,
    tokenizer: Any,
) -> tuple[Measure, list[float]]:
    """``n_requests`` single-turn samples through TextRollout over ``urls``."""
    rollout_config = TextRolloutConfig(
        n_samples_per_prompt=4, sampling=TextSamplingParams(max_new_tokens=n), engines=config
    )
    groups = token_groups(n_requests, 4, prompt_tokens)
    async with TextRollout.open(urls, tokenizer=tokenizer, config=rollout_config) as rollout:
        async with timed(mode) as m:
            result = await rollout.run(groups)
        m.requests = len(result.samples)
        m.output_tokens = check(result.samples, n, prompt_tokens)
    latencies = [
        s.generate_end - s.generate_start
        for s in result.spans
        if s.generate_end and s.generate_start
    ]
    return m, latencies


def add_latency(m: Measure, latencies: list[float], service_s: float) -> None:
    ordered = sorted(latencies)
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        value = ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
        m.extra[f"latency_{name}_ms"] = 1000 * value
        m.extra[f"added_latency_{name}_ms"] = 1000 * (value - service_s)


async def served_twice(urls: list[str]) -> float:
    async with aiohttp.ClientSession() as http:
        return float(sum([(await mock_stats(http, u))["served_twice"] for u in urls]))


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for url in urls:
            await mock_reset(http, url)


async def text_modes(
    args: argparse.Namespace, fast: list[str], slow: list[str], tokenizer: Any
) -> list[Measure]:
    out: list[Measure] = []
    async with (
        SmgRouter(fast, flags=SMG_FLAGS) as fast_smg,
        SmgRouter(slow, flags=SMG_FLAGS) as slow_smg,
    ):
        # Warm both paths (connections, lazy imports): the first mode would pay for them.
        for urls, front in (([fast_smg.url], True), (fast, False)):
            await rollout_generate(urls, engines(8, front), 64, 4, 16, "warm", tokenizer)

        async def one(
            urls: list[str], front: bool, c: int, n: int, mode: str, service: float
        ) -> Measure:
            await reset(urls if not front else fast)
            m, lat = await rollout_generate(
                urls, engines(c, front), n, args.output_tokens, args.prompt_tokens, mode, tokenizer
            )
            add_latency(m, lat, service)
            m.extra["served_twice"] = await served_twice(fast)
            return m

        for c in args.concurrency:
            n = max(args.requests, 2 * c)
            direct, through = await best_pair(
                args.repeats,
                partial(one, fast, False, c, n, f"direct@{c}", 0.0),
                partial(one, [fast_smg.url], True, c, n, f"smg@{c}", 0.0),
            )
            through.baseline = direct.mode
            through.extra["throughput_vs_direct"] = through.rps / direct.rps
            through.extra["cpu_per_request_vs_direct"] = (through.cpu_s / through.requests) / (
                direct.cpu_s / direct.requests
            )
            out += [direct, through]
        c = args.latency_concurrency
        n = 8 * c
        service = args.output_tokens * args.token_latency_ms / 1000
        direct, through = await best_pair(
            args.repeats,
            partial(one, slow, False, c, n, f"latency-direct@{c}", service),
            partial(one, [slow_smg.url], True, c, n, f"latency-smg@{c}", service),
        )
        through.baseline = direct.mode
        for q in ("p50", "p99"):
            key = f"added_latency_{q}_ms"
            through.extra[f"{key}_over_direct"] = through.extra[key] - direct.extra[key]
        out += [direct, through]
    return out


@contextmanager
def dask_cluster(workers: int) -> Iterator[str]:
    """A Dask scheduler and ``workers`` single-thread workers, each a process of its own
    (as on other hosts); yields the scheduler address."""
    folder = Path(tempfile.mkdtemp(prefix="scale-dask-"))
    scheduler_file = folder / "scheduler.json"
    log = (folder / "dask.log").open("wb")
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [
        subprocess.Popen(
            [
                *dask,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(scheduler_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"the Dask scheduler did not start; see {folder}/dask.log")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole by then
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    address,
                    "--nworkers",
                    str(workers),
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--local-directory",
                    str(folder),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=folder,
            )
        )
        yield address
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(10)
        log.close()


async def reward_calls(pool: Any, calls: int, in_flight: int, mode: str) -> Measure:
    samples = [
        Sample(index=i, group_index=i, prompt="", tokens=list(range(i % 13))) for i in range(calls)
    ]
    scores: list[Any] = [None] * calls
    latencies: list[float] = []
    limit = anyio.Semaphore(in_flight)
    async with timed(mode) as m:

        async def one(i: int) -> None:
            async with limit:
                t0 = time.perf_counter()
                scores[i] = (await pool.score([samples[i]]))[0]
                latencies.append(time.perf_counter() - t0)

        async with anyio.create_task_group() as tg:
            for i in range(calls):
                tg.start_soon(one, i)
    m.requests = calls
    add_latency(m, latencies, REWARD_S)
    # Both pools must give the function's own answer, sample by sample.
    if scores != [float(len(s.tokens) % 7) for s in samples]:
        raise AssertionError(f"{mode}: scores differ from the reward function's")
    return m


async def reward_modes(args: argparse.Namespace, address: str) -> list[Measure]:
    out: list[Measure] = []
    workers = 2
    async with (
        RewardPool("r", reward_50ms, workers=workers) as local,
        DaskRewardPool("r", reward_50ms, address=address) as remote,
    ):
        # Warm every worker (a Dask worker imports torch when it first unpickles a Sample).
        for pool in (local, remote):
            await reward_calls(pool, 4 * workers, 2 * workers, "warm")
        for in_flight, tag in ((2 * workers, ""), (1, "-sequential")):
            calls = args.reward_calls if in_flight > 1 else max(8, args.reward_calls // 4)
            near, far = await best_pair(
                args.repeats,
                partial(reward_calls, local, calls, in_flight, f"reward-local{tag}"),
                partial(reward_calls, remote, calls, in_flight, f"reward-dask{tag}"),
            )
            far.baseline = near.mode
            far.extra["throughput_vs_local"] = far.rps / near.rps
            far.extra["overhead_ms_over_local"] = (
                far.extra["added_latency_p50_ms"] - near.extra["added_latency_p50_ms"]
            )
            out += [near, far]
    return out


async def run_all(
    args: argparse.Namespace, fast: list[str], slow: list[str], address: str
) -> list[Measure]:
    from miles_lite.testing import load_qwen3_tokenizer

    tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
    # As a tuned trainer does after its imports: a full collection of what torch and
    # transformers left would land in some measured run as a stall.
    gc.freeze()
    return [*await text_modes(args, fast, slow, tokenizer), *await reward_modes(args, address)]


def row(m: Measure) -> dict[str, Any]:
    """One mode's figures, as the JSON line gives them."""
    return {
        "mode": m.mode,
        "baseline": m.baseline or None,
        "requests_per_s": round(m.rps, 1),
        "cpu_ms_per_request": round(1000 * m.cpu_s / max(m.requests, 1), 3),
        **{k: round(v, 3) for k, v in m.extra.items()},
    }


def table(results: list[Measure]) -> str:
    lines = [
        "| mode | req/s | vs baseline | CPU ms/req | p50 / p99 ms | added p50 ms | notes |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    by_mode = {m.mode: m for m in results}
    shown = ("latency_p50_ms", "latency_p99_ms", "added_latency_p50_ms", "added_latency_p99_ms")
    for m in results:
        base = by_mode.get(m.baseline)
        ratio = f"{m.rps / base.rps:.2f}x" if base and base.rps else "-"
        notes = ", ".join(f"{k}={v:.3g}" for k, v in m.extra.items() if k not in shown)
        lines.append(
            f"| {m.mode} | {m.rps:.0f} | {ratio} | {1000 * m.cpu_s / max(m.requests, 1):.2f} | "
            f"{m.extra.get('latency_p50_ms', 0):.1f} / {m.extra.get('latency_p99_ms', 0):.1f} | "
            f"{m.extra.get('added_latency_p50_ms', 0):.2f} | {notes} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, about a minute")
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--token-latency-ms", type=float, default=2.0)
    parser.add_argument("--latency-concurrency", type=int, default=16)
    parser.add_argument("--reward-calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per mode")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = 256
        args.concurrency = [16]
        args.reward_calls = 40
        args.repeats = 1
    latency_s = args.token_latency_ms / 1000
    with (
        MockProcess(0.0, 8) as fast_a,
        MockProcess(0.0, 8) as fast_b,
        MockProcess(latency_s, 8) as slow_a,
        MockProcess(latency_s, 8) as slow_b,
        dask_cluster(2) as address,
    ):
        results = run_sync(run_all, args, [fast_a, fast_b], [slow_a, slow_b], address)
    print(table(results))
    print(json.dumps({"scale": [row(m) for m in results], "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
