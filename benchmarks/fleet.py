"""Samples/s of a text rollout on two stand-in engines (child processes) while one of them is
SIGKILLed and restarted on its port, again and again (killed once it holds requests, then
``--kill-every-s`` seconds after each restart is serving), side by side with the
undisturbed run, in one run (issue 33).

    python benchmarks/fleet.py --quick     # under a minute
    python benchmarks/fleet.py             # the default workload

Both engines first take weight version "1" from a folder, so every restarted engine comes
back on its launch weights and is fenced until the fleet caught it up. Per mode
(``steady``, ``killed``, alternating ``--repeats`` times): samples/s (every sample given,
whatever its status), the samples that came back FAILED (those the killed engine held: a
generation is never re-sent elsewhere), kills, the fleet's catch-ups in the run
(and after it, until the engine is back), and requests a restarted engine received before it reported "1"
(``early_requests``: the fence says 0). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.rollout.result import RolloutResult
from miles_lite.testing import TextPolicy, TextStandInConfig
from miles_lite.testing.text.process import TextEngineProcess
from miles_lite.testing.tokenizers import load_qwen3_tokenizer
from miles_lite.types import SampleStatus


class Fleet:
    """Two stand-in children; the second one can be killed and restarted on its port."""

    def __init__(self, config: TextStandInConfig) -> None:
        self.config = config
        self.steady = TextEngineProcess(config)
        self.victim = TextEngineProcess(config)
        self.dead: list[TextEngineProcess] = []
        self.restarted: list[TextEngineProcess] = []

    @property
    def urls(self) -> list[str]:
        return [self.steady.url, self.victim.url]

    def start(self) -> None:
        self.steady.start()
        self.victim.start()

    def kill_and_restart(self) -> None:
        """SIGKILL the victim, then start it again on its port with its launch weights
        (blocking: run in a worker thread)."""
        old = self.victim
        assert old.pid is not None
        os.kill(old.pid, signal.SIGKILL)
        old.stop()  # reaps it
        self.dead.append(old)
        port = int(old.url.rsplit(":", 1)[1])
        self.victim = TextEngineProcess(dataclasses.replace(self.config, port=port))
        self.victim.start()
        self.restarted.append(self.victim)

    def stop(self) -> None:
        for process in (self.steady, self.victim, *self.dead):
            process.stop()


def early_requests(fleet: Fleet, version: str) -> int:
    """Requests the restarted engines received while they reported another version."""
    early = 0
    for process in fleet.restarted:
        if process.is_alive():
            early += sum(v != version for v in process.stats()["request_versions"])
    return early


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            if condition():
                return
            await anyio.sleep(0.005)


async def one_run(
    rollout: TextRollout, fleet: Fleet, prompts: list[str], kill_every_s: float | None
) -> dict[str, Any]:
    router = rollout.router
    kills = 0
    result: RolloutResult | None = None
    before = router.statistics().fleet
    start = time.perf_counter()
    elapsed = 0.0
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            nonlocal result, elapsed
            result = await rollout.run(prompts)
            elapsed = time.perf_counter() - start  # not the restart under way, if any
            tg.cancel_scope.cancel()

        async def killer() -> None:
            nonlocal kills
            assert kill_every_s is not None
            await until(lambda: router.in_flight(fleet.victim.url) > 0)  # the first finds work
            while True:
                await anyio.to_thread.run_sync(fleet.kill_and_restart)
                kills += 1
                await anyio.sleep(kill_every_s)

        tg.start_soon(run)
        if kill_every_s is not None:
            tg.start_soon(killer)
    assert result is not None
    flat = [s for part in (result.groups, result.filtered, result.partial) for g in part for s in g]
    keys = {(s.group_index, s.index) for s in flat}
    # Every engine back and serving before the next run.
    await until(lambda: len(router.healthy_urls) == 2)
    moved = router.statistics().fleet.metrics_since(before)  # the run and the return
    return {
        "seconds": elapsed,
        "samples": len(flat),
        "exactly_once": len(keys) == len(flat),
        "samples_per_s": len(flat) / elapsed,
        "failed": sum(s.status is SampleStatus.FAILED for s in flat),
        "kills": kills,
        "catch_ups": moved["fleet/catch_ups"],
        "fenced": moved["fleet/fenced"],
    }


async def run_all(args: argparse.Namespace, fleet: Fleet, folder: str) -> dict[str, Any]:
    tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
    settings = TextRolloutConfig(
        n_samples_per_prompt=args.samples_per_prompt,
        sampling=TextSamplingParams(max_new_tokens=args.tokens, extra={"ignore_eos": True}),
        engines=EngineConfig(
            router=RouterConfig(
                max_inflight_per_engine=args.in_flight,
                health_interval_s=0.1,
                health_timeout_s=1.0,
                failure_threshold=1,
                readmit_cooldown_s=0.1,
                wait_timeout_s=60.0,
            ),
            client=EngineClientConfig(read_timeout_s=60.0, retry=RetryPolicy(max_attempts=2)),
        ),
    )
    prompts = [f"Count with me, {i}:" for i in range(args.prompts)]
    rows: dict[str, list[dict[str, Any]]] = {"steady": [], "killed": []}
    async with TextRollout.open(fleet.urls, tokenizer=tokenizer, config=settings) as rollout:
        await rollout.update_weights(folder, version="1")
        for _ in range(args.repeats):
            rows["steady"].append(await one_run(rollout, fleet, prompts, None))
            rows["killed"].append(await one_run(rollout, fleet, prompts, args.kill_every_s))
        fleet_stats = rollout.router.statistics().fleet
    early = await anyio.to_thread.run_sync(early_requests, fleet, "1")
    out: dict[str, Any] = {
        "prompts": args.prompts,
        "samples_per_prompt": args.samples_per_prompt,
        "tokens": args.tokens,
        "token_latency_s": args.token_latency_s,
        "kill_every_s": args.kill_every_s,
        "repeats": args.repeats,
        "early_requests": early,
        "catch_up_gave_up": fleet_stats.catch_up_gave_up,
    }
    for mode, runs in rows.items():
        out[mode] = {
            "samples_per_s": max(r["samples_per_s"] for r in runs),
            "samples": sum(r["samples"] for r in runs),
            "exactly_once": all(r["exactly_once"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "kills": sum(r["kills"] for r in runs),
            "catch_ups": sum(r["catch_ups"] for r in runs),
            "fenced": sum(r["fenced"] for r in runs),
            "runs": runs,
        }
    out["ratio"] = out["killed"]["samples_per_s"] / out["steady"]["samples_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, under a minute")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--samples-per-prompt", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--token-latency-s", type=float, default=0.005)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--kill-every-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.tokens, args.kill_every_s, args.repeats = 32, 128, 1.0, 1
    policy = TextPolicy(default_length=args.tokens)
    fleet = Fleet(TextStandInConfig(token_latency_s=args.token_latency_s, policy=policy))
    try:
        fleet.start()
        with tempfile.TemporaryDirectory() as folder:
            out = run_sync(run_all, args, fleet, folder)
    finally:
        fleet.stop()
    print(f"{'':16} {'steady':>10} {'killed':>10}")
    for key, fmt in (
        ("samples_per_s", ".1f"),
        ("samples", "d"),
        ("failed", "d"),
        ("kills", "d"),
        ("catch_ups", ".0f"),
        ("fenced", ".0f"),
    ):
        print(f"{key:16} {out['steady'][key]:>10{fmt}} {out['killed'][key]:>10{fmt}}")
    print(
        f"killed/steady samples/s {out['ratio']:.3f}; requests before catch-up:"
        f" {out['early_requests']}"
    )
    print(json.dumps({"fleet": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
