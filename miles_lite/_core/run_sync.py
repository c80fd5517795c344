"""Run an async entry point from synchronous code; refused where an event loop already runs."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from miles_lite.errors import EventLoopError

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(fn: Callable[..., Awaitable[T]], *args: Any, use_uvloop: bool = False) -> T:
    """Run ``await fn(*args)`` to completion and return its result (``anyio.run``).

    For scripts and other synchronous code. Where this thread already runs an event loop
    (a Jupyter cell, async code), raises :class:`~miles_lite.errors.EventLoopError` at
    once: waiting here would block that loop, and whatever it serves (a stand-in engine
    started in an earlier cell, a session server) would never answer, so the call would
    hang. ``await fn(*args)`` there instead (top-level ``await`` works in a cell).
    ``use_uvloop`` runs the loop on uvloop (``pip install miles-lite[uvloop]``).

    In the main thread, SIGTERM (a preempted or killed job) cancels ``fn``: its
    ``async with`` blocks close (pools stop their workers, in-flight requests are
    cancelled), then ``SystemExit(143)`` is raised, the exit status of a SIGTERM.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        name = getattr(fn, "__name__", repr(fn))
        raise EventLoopError(
            f"run_sync({name}) was called where an event loop is running (a notebook cell,"
            f" async code): it would block that loop; use `await {name}(...)` here"
        )
    options = {"use_uvloop": use_uvloop}
    if threading.current_thread() is threading.main_thread():
        return anyio.run(_until_sigterm, fn, args, backend="asyncio", backend_options=options)
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)


async def _until_sigterm(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    """``await fn(*args)``, cancelled cleanly by SIGTERM (then SystemExit(143))."""
    results: list[T] = []
    errors: list[Exception] = []
    terminated = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal terminated
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    terminated = True
                    tg.cancel_scope.cancel()
                    return

        async def run() -> None:
            try:
                results.append(await fn(*args))
            except Exception as exc:  # re-raised as itself, not in an exception group
                errors.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    if terminated:
        raise SystemExit(128 + signal.SIGTERM)
    if errors:
        raise errors[0]
    return results[0]
