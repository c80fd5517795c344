"""Waiting in tests for a state another task or process reaches."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def wait_until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Return once ``condition()`` is true; ``TimeoutError`` after ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        while True:
            if condition():
                return
            await anyio.sleep(0.005)
