"""What tokenizing its prompts costs a text rollout: chat prompts, side by side with the same
prompts given as token ids (the floor: nothing to tokenize), in one run.

    python benchmarks/prompts.py --quick     # under a minute
    python benchmarks/prompts.py             # the default workload

``TextRollout.run`` of ``--groups`` groups of ``--samples`` (GRPO's n samples a prompt),
each group a distinct chat prompt (a system prompt and a math question, about 160 tokens
through the real Qwen3 chat template), ``--output-tokens`` of answer each, at
``--concurrency`` in flight against the text benchmark's mock engine (``text_mock.py`` in
its own process, prebuilt answers). Alternately:

- ``ids``: each sample given its prompt's ids (tokenized before the clock starts);
- ``chat``: each sample given the chat messages (the rollout tokenizes them).

Per arm, the best of ``--repeats`` alternating pairs: samples/s, the event loop thread's
CPU and the whole process's CPU a sample (the tokenizer's threads included), and the
tokenizer calls the rollout made (a counter: one a group when a group's samples share
their prompt's call, one a sample when they do not). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_layer import engines
from text_mock import MockProcess, output_ids

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.text import tokenize
from miles_lite.types import Sample

SYSTEM = (
    "You are a careful math tutor. Think step by step, show the intermediate results,"
    " check the arithmetic once more, and put the final answer in \\boxed{}."
)


def chat_prompts(groups: int) -> list[list[dict[str, str]]]:
    """Distinct chat prompts, GSM8K-shaped."""
    return [
        [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": (
                    f"A baker makes {g + 3} trays of {g % 7 + 12} rolls each morning and sells"
                    f" {g % 5 + 2} trays before noon. In the afternoon a café orders"
                    f" {g % 11 + 20} rolls and a school orders twice as many as the café."
                    " The baker keeps a spare tray for the evening. How many rolls are left"
                    " at the end of the day, and how many more trays would be needed to fill"
                    " every order if the school doubled its order again? Explain each step,"
                    " name the quantity each number stands for, and check the result by"
                    " adding the rolls sold back to the rolls left."
                ),
            },
        ]
        for g in range(groups)
    ]


class Tokenized:
    """Counts the rollout's tokenizer calls (``tokenize.prompt_ids``: one a chat template
    and encode) while in use."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = tokenize.prompt_ids

    def __enter__(self) -> Tokenized:
        real = self._real

        async def counted(*args: Any, **kwargs: Any) -> list[int]:
            self.calls += 1
            return await real(*args, **kwargs)

        tokenize.prompt_ids = counted  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        tokenize.prompt_ids = self._real  # type: ignore[assignment]


def id_groups(ids: list[list[int]], samples: int) -> list[list[Sample]]:
    """Each prompt's ids as a group of ``samples`` token-prompt samples."""
    return [
        [
            Sample(index=g * samples + j, group_index=g, prompt="", tokens=list(prompt))
            for j in range(samples)
        ]
        for g, prompt in enumerate(ids)
    ]


async def one_run(
    url: str, args: argparse.Namespace, tokenizer: Any, arm: str, ids: list[list[int]]
) -> dict[str, float]:
    config = TextRolloutConfig(
        n_samples_per_prompt=args.samples,
        sampling=TextSamplingParams(max_new_tokens=args.output_tokens),
        engines=engines(args.concurrency),
    )
    groups: Any = chat_prompts(args.groups) if arm == "chat" else id_groups(ids, args.samples)
    async with TextRollout.open([url], tokenizer=tokenizer, config=config) as rollout:
        gc.collect()
        with Tokenized() as counted:
            loop0, cpu0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
            result = await rollout.run(groups)
            seconds = time.perf_counter() - t0
            cpu, loop = time.process_time() - cpu0, time.thread_time() - loop0
    samples = result.samples
    want = output_ids(args.output_tokens)
    for group, prompt in zip(result.groups, ids, strict=True):
        for s in group:
            if s.tokens != prompt + want:
                raise AssertionError(f"sample {s.index}: not the prompt's ids and the answer")
    n = len(samples)
    return {
        "samples_per_s": n / seconds,
        "loop_cpu_us": 1e6 * loop / n,
        "process_cpu_us": 1e6 * cpu / n,
        "tokenizer_calls": float(counted.calls),
    }


async def run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from miles_lite.testing import load_qwen3_tokenizer

    tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
    ids = [
        list(tokenizer.apply_chat_template(p, add_generation_prompt=True)["input_ids"])
        for p in chat_prompts(args.groups)
    ]
    gc.freeze()  # as text_layer.py does: the heap the imports left is not what is measured
    rows: dict[str, list[dict[str, float]]] = {"ids": [], "chat": []}
    await one_run(url, args, tokenizer, "chat", ids)  # warm-up
    for _ in range(args.repeats):
        for arm in ("ids", "chat"):
            rows[arm].append(await one_run(url, args, tokenizer, arm, ids))

    def best(arm: str, key: str, pick: Any) -> float:
        return float(pick(row[key] for row in rows[arm]))

    out: dict[str, Any] = {
        "groups": args.groups,
        "samples_per_group": args.samples,
        "prompt_tokens_mean": statistics.mean(map(len, ids)),
        "concurrency": args.concurrency,
    }
    for arm in rows:
        out[arm] = {
            "samples_per_s": best(arm, "samples_per_s", max),
            "loop_cpu_us": best(arm, "loop_cpu_us", min),
            "process_cpu_us": best(arm, "process_cpu_us", min),
            "tokenizer_calls_per_group": rows[arm][-1]["tokenizer_calls"] / args.groups,
        }
    out["throughput_ratio"] = out["chat"]["samples_per_s"] / out["ids"]["samples_per_s"]
    out["pair_ratios"] = [
        c["samples_per_s"] / i["samples_per_s"]
        for i, c in zip(rows["ids"], rows["chat"], strict=True)
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, under a minute")
    parser.add_argument("--groups", type=int, default=512)
    parser.add_argument("--samples", type=int, default=8, help="samples a group (a prompt)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.repeats = 64, 1
    with MockProcess(0.0, args.output_tokens) as url:
        out = run_sync(run_all, args, url)
    print(
        f"{args.groups} groups of {args.samples}, chat prompts of"
        f" {out['prompt_tokens_mean']:.0f} tokens, {args.output_tokens} tokens out,"
        f" {args.concurrency} in flight"
    )
    print(f"{'':28} {'ids given':>12} {'chat prompts':>12}")
    for key, label, fmt in (
        ("samples_per_s", "samples/s", "{:12.0f}"),
        ("loop_cpu_us", "loop CPU a sample (us)", "{:12.0f}"),
        ("process_cpu_us", "process CPU a sample (us)", "{:12.0f}"),
        ("tokenizer_calls_per_group", "tokenizer calls a group", "{:12.2f}"),
    ):
        cells = "".join(fmt.format(out[arm][key]) for arm in ("ids", "chat"))
        print(f"{label:28} {cells}")
    pairs = ", ".join(f"{r:.2f}" for r in out["pair_ratios"])
    print(f"chat / ids throughput: {out['throughput_ratio']:.2f}x (pairs {pairs})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
