"""What a trainer's loop costs through the rollout, side by side with its baselines, in one run.

    python benchmarks/training.py --quick     # under a minute
    python benchmarks/training.py             # the default workload
    python benchmarks/training.py --url http://127.0.0.1:30000 --model DIR   # a real server

Two measurements, each next to its baseline:

- ``update@<mode>/N``: one ``update_weights`` round trip (pause -> push -> flush where the
  mode allows -> version read -> continue, and the flush's canary) with N requests in
  flight, per pause mode, against the same mode with nothing in flight (``ratio``). Also
  ``paused_s`` (how long generation was held) and, as counters, how many of the N
  requests survived (all of them, except with ``abort``) and how many made tokens with
  two versions. Against the stand-in (a scripted policy: nothing to load, so this is the
  control path's own cost) or, with ``--url``, a real SGLang server loading ``--model``.
- ``loop/stream`` against ``loop/run``: K training steps of G groups each, a training
  step of ``--train-s`` seconds (the trainer's work, simulated by a sleep so that it is
  the same in both), then a weight update. ``run`` generates a step's groups, then
  trains; ``stream`` hands groups over as they finish and generates the next step's
  while the trainer trains (``max_ahead`` two steps' groups). Seconds per step, and the
  stream's speed-up over run (``ratio``).

Prints a table and one JSON line. Never a timed assertion: the smoke test checks counters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.sglang.control import PauseMode
from miles_lite.testing import (
    TextEngineProcess,
    TextPolicy,
    TextStandInConfig,
    load_qwen3_tokenizer,
)


@dataclass
class Row:
    """One measurement: its ``mode``, seconds, and the baseline ratio."""

    mode: str
    seconds: float
    ratio: float
    paused_s: float = 0.0
    survived: int = 0
    two_versions: int = 0
    in_flight: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()}


@asynccontextmanager
async def engine_urls(args: argparse.Namespace) -> AsyncIterator[list[str]]:
    if args.url:
        yield [args.url]
        return
    config = TextStandInConfig(
        token_latency_s=args.token_latency_s,
        max_running=512,
        policy=TextPolicy(default_length=args.tokens),
    )
    async with TextEngineProcess(config) as engine:
        yield [engine.url]


def rollout_config(args: argparse.Namespace, mode: PauseMode, **more: Any) -> TextRolloutConfig:
    return TextRolloutConfig(
        n_samples_per_prompt=1,
        sampling=TextSamplingParams(max_new_tokens=args.tokens, extra={"ignore_eos": True}),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=512)),
        weight_update=WeightUpdateConfig(mode=mode),
        **more,
    )


async def one_update(
    args: argparse.Namespace, urls: list[str], tokenizer: Any, mode: PauseMode, n: int, tag: str
) -> Row:
    """One update round trip with ``n`` requests in flight (median of ``--repeats``)."""
    times, paused, survived, mixed = [], [], [], []
    async with TextRollout.open(
        urls, tokenizer=tokenizer, config=rollout_config(args, mode)
    ) as rollout:
        for repeat in range(args.repeats):
            result: dict[str, Any] = {}

            async def run(prompts: list[str], result: dict[str, Any] = result) -> None:
                result["r"] = await rollout.run(prompts)

            async with anyio.create_task_group() as tg:
                if n:
                    tg.start_soon(run, [f"p{i}" for i in range(n)])
                    await anyio.sleep(args.lead_s)  # let them all start generating
                report = await rollout.update_weights(
                    args.model, version=f"{tag}-{mode.value}-{n}-{repeat}"
                )
            times.append(report.elapsed_s)
            paused.append(report.paused_s)
            samples = result["r"].samples if n else []
            survived.append(sum(s.finish_reason == "length" for s in samples))
            mixed.append(sum(len({w.version for w in s.weight_spans}) > 1 for s in samples))
    return Row(
        mode=f"update@{mode.value}/{n}",
        seconds=statistics.median(times),
        ratio=1.0,
        paused_s=statistics.median(paused),
        survived=min(survived),
        two_versions=min(mixed),
        in_flight=n,
    )


async def loop(
    args: argparse.Namespace, urls: list[str], tokenizer: Any, streamed: bool, tag: str
) -> Row:
    """``--steps`` training steps of ``--groups`` groups: seconds per step."""
    config = rollout_config(args, PauseMode.RETRACT, max_staleness=1)
    prompts = [f"step prompt {i}" for i in range((args.steps + 2) * args.groups)]
    async with TextRollout.open(urls, tokenizer=tokenizer, config=config) as rollout:
        started = time.monotonic()
        if streamed:
            step, taken = 0, 0
            async with rollout.stream(prompts, max_ahead=2 * args.groups) as groups:
                async for _ in groups:
                    taken += 1
                    if taken % args.groups:
                        continue
                    await anyio.sleep(args.train_s)  # the trainer's step
                    step += 1
                    await rollout.update_weights(args.model, version=f"{tag}-s{step}")
                    if step == args.steps:
                        break
        else:
            for step in range(1, args.steps + 1):
                batch = prompts[(step - 1) * args.groups : step * args.groups]
                await rollout.run(batch)
                await anyio.sleep(args.train_s)
                await rollout.update_weights(args.model, version=f"{tag}-r{step}")
        elapsed = time.monotonic() - started
    return Row(
        mode=f"loop/{'stream' if streamed else 'run'}", seconds=elapsed / args.steps, ratio=1.0
    )


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_qwen3_tokenizer()
    with tempfile.TemporaryDirectory() as scratch:
        args.model = args.model or scratch  # the scripted stand-in loads nothing
        tag = str(int(time.time()))
        rows: list[Row] = []
        async with engine_urls(args) as urls:
            for mode in (PauseMode.RETRACT, PauseMode.IN_PLACE, PauseMode.ABORT):
                base = None
                for n in args.in_flight:
                    row = await one_update(args, urls, tokenizer, mode, n, tag)
                    base = base or row.seconds
                    row.ratio = row.seconds / base
                    rows.append(row)
            run_row = await loop(args, urls, tokenizer, False, tag)
            stream_row = await loop(args, urls, tokenizer, True, tag)
            stream_row.ratio = run_row.seconds / stream_row.seconds
            rows += [run_row, stream_row]
    print(
        f"{'mode':<22}{'seconds':>9}{'ratio':>8}{'paused_s':>10}{'survived':>10}{'2 versions':>11}"
    )
    for r in rows:
        print(
            f"{r.mode:<22}{r.seconds:>9.3f}{r.ratio:>8.2f}{r.paused_s:>10.3f}"
            f"{r.survived:>10}{r.two_versions:>11}"
        )
    print("update ratio: vs the same mode with nothing in flight; loop ratio: run / stream")
    print(json.dumps({"training": [r.as_dict() for r in rows], "args": _args(args)}))


def _args(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k != "model"}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a small load, under a minute (overrides sizes)"
    )
    parser.add_argument("--url", help="a running SGLang server (default: a stand-in)")
    parser.add_argument("--model", type=Path, help="the folder it loads (with --url)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[0, 16, 64, 256])
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--token-latency-s", type=float, default=0.01)
    parser.add_argument("--lead-s", type=float, default=0.2, help="generation before an update")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=8, help="groups per training step")
    parser.add_argument("--train-s", type=float, default=0.3, help="one training step")
    args = parser.parse_args(argv)
    if args.quick:
        args.in_flight, args.repeats, args.steps, args.groups = [0, 16, 64], 1, 3, 4
    if args.url and not args.model:
        parser.error("--url needs --model: the folder the server loads its weights from")
    return args


if __name__ == "__main__":
    run_sync(main, parse())
