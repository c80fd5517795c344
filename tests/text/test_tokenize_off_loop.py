"""Tokenizing and chat-templating long prompts never stalls the event loop (a lag probe)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio
import pytest

from miles_lite.errors import ConfigError
from miles_lite.text.config import TextRolloutConfig
from miles_lite.text.context import TextContext
from miles_lite.text.tokenize import prompt_ids

pytestmark = pytest.mark.anyio


async def _probe(lags: list[float], done: anyio.Event) -> None:
    while not done.is_set():
        start = time.perf_counter()
        await anyio.sleep(0.005)
        lags.append(time.perf_counter() - start - 0.005)


async def test_long_prompts_are_tokenized_while_the_loop_keeps_running(tokenizer: Any) -> None:
    text = " ".join(f"word{i % 997} and more text." for i in range(10000))
    prompts: list[Any] = [text, [{"role": "user", "content": text}]] * 2
    state = TextContext(tokenizer=tokenizer, router=None, tokenize_threads=1)  # type: ignore[arg-type]

    def timed_encode() -> float:
        start = time.perf_counter()
        tokenizer.encode(text, add_special_tokens=False)
        return time.perf_counter() - start

    one_encode_s = await state.off_loop(timed_encode)
    lags: list[float] = []
    done = anyio.Event()
    results: list[list[int]] = []

    async def tokenize(prompt: Any) -> None:
        results.append(await prompt_ids(state, prompt))

    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe, lags, done)
        async with anyio.create_task_group() as work:
            for prompt in prompts:
                work.start_soon(tokenize, prompt)
        done.set()
    assert len(results) == 4 and min(len(r) for r in results) > 35_000
    # On the loop, every prompt would hold it for a whole encode (~0.05-0.4 s here).
    assert one_encode_s > 0.02
    assert len(lags) > 10, "the probe hardly ran: the loop was held"
    assert max(lags) < max(one_encode_s, 0.1), (max(lags), one_encode_s)
    assert statistics.median(lags) < 0.02


def test_tokenize_threads_is_checked() -> None:
    with pytest.raises(ConfigError, match="tokenize_threads"):
        TextRolloutConfig(tokenize_threads=0)
    with pytest.raises(ConfigError, match="tokenize_threads"):
        TextContext(tokenizer=None, router=None, tokenize_threads=0)  # type: ignore[arg-type]
    assert TextRolloutConfig().tokenize_threads >= 1
