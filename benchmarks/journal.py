"""What the rollout journal costs, side by side with no journal, in one run; and how fast a
journal is read back after a crash.

    python benchmarks/journal.py --quick     # under a minute
    python benchmarks/journal.py             # the default workload

- ``generate@C``: the text benchmark's mock path (``text_mock.py`` in its own process,
  prebuilt answers), ``TextRollout.run`` of N single-turn requests of ``--output-tokens``
  at C in flight, alternately without and with a journal (each kept group handed durably,
  each sample recorded as it ends). Per sample: the event loop thread's CPU, the writer
  process's CPU, and the throughput ratio: the best of each arm over ``--repeats``
  alternating pairs, and each pair's own ratio (the collector frozen after the imports,
  as ``text_layer.py`` does, and a collection before each arm);
- ``grpo/stream``: the streamed GRPO loop (``benchmarks/training.py``'s ``loop/stream``,
  as ``examples/grpo_loop.py`` runs it) on the text stand-in in its own process:
  ``--loop-steps`` steps of ``--loop-groups`` groups of 4 samples of ``--loop-tokens``
  tokens, a trainer step of ``--train-s`` (a sleep, the same in both), then the
  ``training_batch``, a weight update and (with the journal) ``commit(step,
  batch=...)``; alternately with ``journal=None`` and with a journal file. Seconds per
  step, samples/s, the loop thread's CPU a sample and the ratio of throughputs;
- ``recover``: a journal of ``--recover-groups`` handed groups (8 samples of
  ``--output-tokens`` each) read back by ``read_resume`` (the groups handed after the
  last commit, decoded), in seconds.

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_layer import MockProcess, check, engines, token_groups

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextEngineProcess, TextPolicy, TextStandInConfig
from miles_lite.training import Journal, JournalConfig, training_batch
from miles_lite.types import Sample, SampleStatus


async def one_run(
    url: str, args: argparse.Namespace, tokenizer: Any, journal_path: Path | None
) -> dict[str, float]:
    config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=args.output_tokens),
        engines=engines(args.concurrency),
    )
    groups = token_groups(args.requests, 4, args.prompt_tokens)
    journal = Journal(journal_path, JournalConfig(check="none")) if journal_path else None
    async with (
        journal if journal is not None else _nothing(),
        TextRollout.open([url], tokenizer=tokenizer, config=config, journal=journal) as rollout,
    ):
        # The loop thread's own CPU: what the journal costs the event loop (the writer
        # process's CPU is counted apart).
        cpu0, t0 = time.thread_time(), time.perf_counter()
        writer0 = journal.statistics().cpu_s if journal is not None else 0.0
        result = await rollout.run(groups)
        seconds = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        writer = (journal.statistics().cpu_s - writer0) if journal is not None else 0.0
        blocked = journal.statistics().blocked_puts if journal is not None else 0
    samples = result.samples
    check(samples, args.output_tokens, args.prompt_tokens)
    n = len(samples)
    return {
        "samples": n,
        "samples_per_s": n / seconds,
        "main_cpu_us_per_sample": 1e6 * cpu / n,
        "writer_cpu_us_per_sample": 1e6 * writer / n,
        "blocked_puts": float(blocked),
    }


class _nothing:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


class Even:
    """The GRPO example's reward: the share of even ids in the response."""

    async def score(self, samples: list[Sample]) -> list[float]:
        out = []
        for s in samples:
            response = s.tokens[len(s.tokens) - s.response_length :]
            out.append(sum(t % 2 == 0 for t in response) / max(1, len(response)))
        return out


async def grpo_loop(
    url: str, args: argparse.Namespace, tokenizer: Any, journal_path: Path | None, tag: str
) -> dict[str, float]:
    """The streamed GRPO loop: groups handed as they finish, the next step's generated
    while the trainer trains; with a journal, each step committed with its batch."""
    config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=args.loop_tokens, extra={"ignore_eos": True}),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=512)),
        reward="even",
        max_staleness=1,
    )
    per_step = args.loop_groups
    prompts = [
        PromptGroup(prompt=f"step prompt {i}", metadata={"prompt_id": i})
        for i in range((args.loop_steps + 2) * per_step)
    ]
    journal = Journal(journal_path, JournalConfig(check="none")) if journal_path else None
    samples = 0
    async with (
        journal if journal is not None else _nothing(),
        TextRollout.open(
            [url], tokenizer=tokenizer, config=config, rewards={"even": Even()}, journal=journal
        ) as rollout,
    ):
        cpu0, t0 = time.thread_time(), time.perf_counter()
        writer0 = journal.statistics().cpu_s if journal is not None else 0.0
        step, batch = 0, []
        async with rollout.stream(prompts, max_ahead=2 * per_step) as groups:
            async for group in groups:
                batch.append(group)
                if len(batch) < per_step:
                    continue
                data = training_batch(batch)
                await anyio.sleep(args.train_s)  # the trainer's step
                step += 1
                samples += sum(len(g) for g in batch)
                if journal is not None:
                    await rollout.commit(step, batch=data)
                await rollout.update_weights(args.model, version=f"{tag}-s{step}")
                batch = []
                if step == args.loop_steps:
                    break
        seconds = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        writer = (journal.statistics().cpu_s - writer0) if journal is not None else 0.0
    return {
        "samples": samples,
        "step_s": seconds / args.loop_steps,
        "samples_per_s": samples / seconds,
        "main_cpu_us_per_sample": 1e6 * cpu / samples,
        "writer_cpu_us_per_sample": 1e6 * writer / samples,
    }


async def grpo_side_by_side(args: argparse.Namespace, tokenizer: Any, tmp: Path) -> dict[str, Any]:
    """``grpo_loop`` alternately without and with a journal, ``--repeats`` times each, on
    one stand-in; the best of each side."""
    stand_in = TextStandInConfig(
        token_latency_s=args.loop_token_latency_s,
        max_running=512,
        policy=TextPolicy(default_length=args.loop_tokens),
    )
    rows: dict[str, list[dict[str, float]]] = {"none": [], "journal": []}
    args.model = tmp  # the scripted stand-in loads nothing
    tag = str(int(time.time()))
    async with TextEngineProcess(stand_in) as engine:
        await grpo_loop(engine.url, args, tokenizer, None, f"{tag}-warm")
        for r in range(args.repeats):
            rows["none"].append(await grpo_loop(engine.url, args, tokenizer, None, f"{tag}-n{r}"))
            path = tmp / f"grpo{r}.db"
            rows["journal"].append(
                await grpo_loop(engine.url, args, tokenizer, path, f"{tag}-j{r}")
            )

    def best(mode: str, key: str, pick: Any) -> float:
        return float(pick(row[key] for row in rows[mode]))

    out: dict[str, Any] = {
        "mode": "grpo/stream",
        "none_samples": best("none", "samples", min),
        "journal_samples": best("journal", "samples", min),
        "steps": args.loop_steps,
        "groups_per_step": args.loop_groups,
        "tokens": args.loop_tokens,
        "none_step_s": best("none", "step_s", min),
        "journal_step_s": best("journal", "step_s", min),
        "none_samples_per_s": best("none", "samples_per_s", max),
        "journal_samples_per_s": best("journal", "samples_per_s", max),
        "none_main_cpu_us": best("none", "main_cpu_us_per_sample", min),
        "journal_main_cpu_us": best("journal", "main_cpu_us_per_sample", min),
        "journal_writer_cpu_us": best("journal", "writer_cpu_us_per_sample", min),
    }
    out["throughput_ratio"] = out["journal_samples_per_s"] / out["none_samples_per_s"]
    return out


async def loop_share(path: Path, samples: int, tokens: int) -> tuple[float, float]:
    """The event loop's CPU per sample of the journal's own calls (``record``, as each
    generate call ends), and the writer process's CPU per sample recorded, with nothing
    else running, in microseconds: what the rollout's numbers above cannot resolve from
    run-to-run noise. Each sample is its own, as an engine's answers are (distinct token
    ids across a 151k vocabulary, distinct log-probs), made before the clock starts:
    recording one sample again and again reads as less than half of it (its ids and
    log-probs the same few objects, hot in the cache)."""
    rng = random.Random(0)
    vocab = range(1_000, 151_000)
    made = [
        Sample(
            status=SampleStatus.COMPLETED,
            prompt="p",
            tokens=rng.choices(vocab, k=64 + tokens),
            response_length=tokens,
            loss_mask=[1] * tokens,
            rollout_log_probs=[-5.0 * rng.random() for _ in range(tokens)],
        )
        for _ in range(samples)
    ]
    async with Journal(path, JournalConfig(check="none")) as journal:
        (gid,) = journal.give([[made[0]]], rollout_id=0)
        t0 = time.thread_time()
        for i, sample in enumerate(made):
            await journal.record(gid, i, journal.next_attempt(), [sample])
        loop_s = time.thread_time() - t0
        await journal.flush()
        writer_s = journal.statistics().cpu_s
    return 1e6 * loop_s / samples, 1e6 * writer_s / samples


async def recover(path: Path, groups: int, tokens: int) -> dict[str, float]:
    """Write ``groups`` handed groups of 8 samples, committed but for the last 8 (a step in
    flight at the crash); then time what a restart does: open the file (``quick_check``
    included) and ``resume()``; and, as a worst case, ``read_resume`` of a journal where
    nothing was committed (every group decoded)."""
    async with Journal(path, JournalConfig(check="none")) as journal:
        for start in range(0, groups, 500):
            batch = []
            for g in range(start, min(groups, start + 500)):
                group = [
                    Sample(
                        index=j,
                        prompt=f"p{g}",
                        status=SampleStatus.COMPLETED,
                        tokens=list(range(64 + tokens)),
                        response_length=tokens,
                        loss_mask=[1] * tokens,
                        rollout_log_probs=[-0.5] * tokens,
                        reward=1.0,
                        metadata={"prompt_id": g},
                    )
                    for j in range(8)
                ]
                batch.append(group)
            gids = journal.give(batch, rollout_id=0)
            if start + 500 >= groups:
                await journal.commit(start // 500 + 1)  # all but this last batch...
                batch, gids = batch[-8:], gids[-8:]  # ...and its last 8 stay in flight
            refs = [[None] * 8 for _ in batch]  # whole records: a fair worst case
            await journal.hand(list(zip(gids, batch, refs, strict=True)))
            if start + 500 < groups:
                await journal.commit(start // 500 + 1)
    t0 = time.perf_counter()
    async with Journal(path) as journal:  # quick_check on open
        state = await journal.resume()
    restart_s = time.perf_counter() - t0
    assert len(state.handed) == 8
    size = (await anyio.Path(path).stat()).st_size
    return {"groups": groups, "restart_s": restart_s, "mb": size / 2**20}


async def run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from miles_lite.testing import load_qwen3_tokenizer

    tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
    # As benchmarks/text_layer.py does (what a tuned trainer does after its imports): a
    # full collection of the heap torch and transformers leave takes 0.15-0.3 s here, 5-8%
    # of a run, and lands in one arm or the other by chance. Each arm starts from the same
    # collector state (a collection before it), so what differs is what the arm allocates.
    gc.freeze()
    rows: dict[str, list[dict[str, float]]] = {"none": [], "journal": []}
    with tempfile.TemporaryDirectory(prefix="journal-bench-") as tmp:
        await one_run(url, args, tokenizer, None)  # warm-up
        for r in range(args.repeats):
            gc.collect()
            rows["none"].append(await one_run(url, args, tokenizer, None))
            path = Path(tmp) / f"run{r}.db"
            gc.collect()
            rows["journal"].append(await one_run(url, args, tokenizer, path))
        loop_us, writer_alone_us = await loop_share(
            Path(tmp) / "loop.db", 4_000, args.output_tokens
        )
        recovery = await recover(Path(tmp) / "recover.db", args.recover_groups, args.output_tokens)
        grpo = await grpo_side_by_side(args, tokenizer, Path(tmp))

    def best(mode: str, key: str, pick: Any) -> float:
        return float(pick(row[key] for row in rows[mode]))

    out = {
        "mode": f"generate@{args.concurrency}",
        "requests": args.requests,
        "output_tokens": args.output_tokens,
        "none_samples_per_s": best("none", "samples_per_s", max),
        "journal_samples_per_s": best("journal", "samples_per_s", max),
        "none_main_cpu_us": best("none", "main_cpu_us_per_sample", min),
        "journal_main_cpu_us": best("journal", "main_cpu_us_per_sample", min),
        "journal_writer_cpu_us": best("journal", "writer_cpu_us_per_sample", min),
        "blocked_puts": best("journal", "blocked_puts", max),
        "loop_us_per_sample_record": loop_us,
        "writer_us_per_sample_alone": writer_alone_us,
        "recover": recovery,
        "grpo": grpo,
    }
    out["throughput_ratio"] = out["journal_samples_per_s"] / out["none_samples_per_s"]
    out["main_cpu_added_us"] = out["journal_main_cpu_us"] - out["none_main_cpu_us"]
    # Each pair's own ratio (run back to back): how far one pair moves from the next.
    pairs = [
        j["samples_per_s"] / n["samples_per_s"]
        for n, j in zip(rows["none"], rows["journal"], strict=True)
    ]
    out["pair_ratios"] = pairs
    out["pair_ratio_median"] = statistics.median(pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, under a minute")
    parser.add_argument("--requests", type=int, default=8192)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recover-groups", type=int, default=10_000)
    parser.add_argument("--loop-steps", type=int, default=8, help="GRPO loop: steps")
    parser.add_argument("--loop-groups", type=int, default=16, help="GRPO loop: groups a step")
    parser.add_argument("--loop-tokens", type=int, default=128, help="GRPO loop: tokens a sample")
    parser.add_argument("--loop-token-latency-s", type=float, default=0.002)
    parser.add_argument("--train-s", type=float, default=0.3, help="GRPO loop: a trainer step")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.repeats, args.recover_groups = 2048, 2, 10_000
        args.loop_steps, args.loop_groups = 4, 8
    with MockProcess(0.0, 32) as url:
        out = run_sync(run_all, args, url)
    rec = out["recover"]
    print(f"{'':28} {'no journal':>12} {'journal':>12}")
    print(
        f"{'samples/s':28} {out['none_samples_per_s']:>12.0f} {out['journal_samples_per_s']:>12.0f}"
    )
    print(
        f"{'main CPU us/sample':28} {out['none_main_cpu_us']:>12.1f}"
        f" {out['journal_main_cpu_us']:>12.1f}"
    )
    print(f"{'writer CPU us/sample':28} {'-':>12} {out['journal_writer_cpu_us']:>12.1f}")
    print(
        f"throughput ratio {out['throughput_ratio']:.3f} (best of each arm); pairs"
        f" {', '.join(f'{r:.3f}' for r in out['pair_ratios'])}, median"
        f" {out['pair_ratio_median']:.3f}; main CPU added {out['main_cpu_added_us']:.1f} us/sample"
    )
    print(
        f"recording alone: loop {out['loop_us_per_sample_record']:.1f} us/sample,"
        f" writer {out['writer_us_per_sample_alone']:.1f} us/sample"
    )
    print(
        f"restart on a {rec['groups']}-group journal ({rec['mb']:.0f} MB, 8 groups in"
        f" flight): open (quick_check) + resume {rec['restart_s']:.2f} s"
    )
    grpo = out["grpo"]
    print(
        f"streamed GRPO loop ({grpo['steps']} steps x {grpo['groups_per_step']} groups x 4"
        f" samples x {grpo['tokens']} tokens, stand-in):"
    )
    print(f"{'':28} {'no journal':>12} {'journal':>12}")
    print(f"{'  seconds/step':28} {grpo['none_step_s']:>12.3f} {grpo['journal_step_s']:>12.3f}")
    print(
        f"{'  samples/s':28} {grpo['none_samples_per_s']:>12.1f}"
        f" {grpo['journal_samples_per_s']:>12.1f}"
    )
    print(
        f"{'  main CPU us/sample':28} {grpo['none_main_cpu_us']:>12.1f}"
        f" {grpo['journal_main_cpu_us']:>12.1f}"
    )
    print(f"{'  writer CPU us/sample':28} {'-':>12} {grpo['journal_writer_cpu_us']:>12.1f}")
    print(f"  throughput ratio {grpo['throughput_ratio']:.3f}")
    print(json.dumps({"journal": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
