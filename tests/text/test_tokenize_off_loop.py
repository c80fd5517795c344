"""Tokenizing and chat-templating long prompts never stalls the event loop (a lag probe)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import anyio
import pytest

from miles_lite.errors import ConfigError
from miles_lite.text.config import TextRolloutConfig
from miles_lite.text.context import TextContext
from miles_lite.text.tokenize import MESSAGE_CHARS, ON_LOOP_PROMPT_CHARS, prompt_chars, prompt_ids

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


async def test_short_prompts_are_tokenized_on_the_loop_long_ones_in_a_thread(
    tokenizer: Any,
) -> None:
    # A hop costs a busy loop more CPU than tokenizing a short prompt on it
    # (benchmarks/prompts.py); the first chat render compiles the template: in a thread.
    state = TextContext(tokenizer=tokenizer, router=None)  # type: ignore[arg-type]
    hops: list[Any] = []
    real = state.off_loop

    async def counted(fn: Any, *args: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args)

    state.off_loop = counted  # type: ignore[method-assign]
    chat = [{"role": "user", "content": "What is 2+3?"}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    call = {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    calls = [*chat, {"role": "assistant", "content": "", "tool_calls": [call]}]
    steps: list[tuple[Any, Any, int]] = [
        ("What is 2+3?", None, 0),
        (chat, None, 1),  # the first chat render
        (chat, None, 1),
        ("word " * 300, None, 2),  # 1,500 characters
        ([{"role": "user", "content": "word " * 200}] * 2, None, 3),
        (chat, tools, 4),
        (calls, None, 5),
    ]
    for prompt, with_tools, want_hops in steps:
        ids = await prompt_ids(state, prompt, tools=with_tools)
        assert ids and type(ids) is list
        assert len(hops) == want_hops, prompt
    assert state.chat_template_compiled
    assert prompt_chars(chat) == len("What is 2+3?") + MESSAGE_CHARS
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is 2+3?"}]}]
    assert prompt_chars(calls) == prompt_chars(parts) == math.inf
    assert prompt_chars("word " * 300) > ON_LOOP_PROMPT_CHARS
