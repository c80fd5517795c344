"""Event-loop lag while a batch of long prompts is tokenized: on the loop vs off it.

A probe task sleeps 5 ms in a loop and records how late it wakes; meanwhile ``--prompts``
long prompts (half plain text, half chat ``messages`` through the Qwen3 chat template)
are tokenized either on the loop (the blocking way) or through ``TextContext.off_loop``
(worker threads; the Rust tokenizer releases the GIL while it encodes).

    python benchmarks/tokenize_loop_lag.py --prompts 8 --words 40000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
import anyio.lowlevel

from miles_lite.testing import load_qwen3_tokenizer
from miles_lite.text.context import TextContext
from miles_lite.text.tokenize import prompt_ids


async def _probe(lags: list[float], done: anyio.Event) -> None:
    while not done.is_set():
        start = time.perf_counter()
        await anyio.sleep(0.005)
        lags.append(time.perf_counter() - start - 0.005)


def _prompts(n: int, words: int) -> list[Any]:
    text = " ".join(f"word{i % 997} and more text." for i in range(words // 4))
    return [text if i % 2 == 0 else [{"role": "user", "content": text}] for i in range(n)]


def _on_loop(tokenizer: Any, prompt: Any) -> None:
    if isinstance(prompt, str):
        tokenizer.encode(prompt, add_special_tokens=False)
    else:
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)


async def measure(
    mode: str, tokenizer: Any, prompts: list[Any], threads: int = 2
) -> dict[str, float]:
    state = TextContext(tokenizer=tokenizer, router=None, tokenize_threads=threads)  # type: ignore[arg-type]
    lags: list[float] = []
    done = anyio.Event()
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe, lags, done)
        await anyio.sleep(0.02)
        if mode == "on-loop":
            for prompt in prompts:
                _on_loop(tokenizer, prompt)
                await anyio.lowlevel.checkpoint()
        else:
            async with anyio.create_task_group() as work:
                for prompt in prompts:
                    work.start_soon(prompt_ids, state, prompt)
        done.set()
    return {
        "wall_s": time.perf_counter() - start,
        "max_lag_ms": 1000 * max(lags),
        "p50_lag_ms": 1000 * statistics.median(lags),
        "probe_wakeups": len(lags),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--words", type=int, default=40000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 8])
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    prompts = _prompts(args.prompts, args.words)
    n_tokens = len(tokenizer.encode(prompts[0], add_special_tokens=False))
    print(f"{args.prompts} prompts of ~{n_tokens} tokens each")
    print(f"{'mode':<13} {'wall s':>7} {'max lag ms':>11} {'p50 lag ms':>11} {'wakeups':>8}")
    runs = [("on-loop", 1)] + [("off-loop", t) for t in args.threads]
    for mode, threads in runs:
        r = await measure(mode, tokenizer, prompts, threads)
        label = mode if mode == "on-loop" else f"{mode} x{threads}"
        print(
            f"{label:<13} {r['wall_s']:>7.2f} {r['max_lag_ms']:>11.1f} {r['p50_lag_ms']:>11.1f}"
            f" {r['probe_wakeups']:>8}"
        )


if __name__ == "__main__":
    anyio.run(main)
