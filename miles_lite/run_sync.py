"""Run an async entry point from synchronous code, even where an event loop already runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(fn: Callable[..., Awaitable[T]], *args: Any, use_uvloop: bool = False) -> T:
    """Run ``await fn(*args)`` to completion and return its result.

    In a script this is ``anyio.run``. Where this thread already runs an event loop (a
    Jupyter cell, an async framework calling sync code), ``asyncio.run`` would refuse;
    then ``fn`` runs on a fresh loop in a helper thread that is joined before returning,
    and the caller's loop waits. Inside async code, prefer ``await fn(*args)``.
    ``use_uvloop`` runs the loop on uvloop (``pip install miles-lite[uvloop]``).
    """
    options = {"use_uvloop": use_uvloop}

    def call() -> T:
        return anyio.run(fn, *args, backend="asyncio", backend_options=options)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with ThreadPoolExecutor(1, thread_name_prefix="miles-lite-run-sync") as executor:
        return executor.submit(call).result()
