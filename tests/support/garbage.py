"""A full garbage collection for async tests, off the event loop."""

from __future__ import annotations

import gc

import anyio


async def collect_garbage() -> None:
    """Run ``gc.collect()`` in a worker thread: a full collection of a process that imported
    torch takes long enough to trip the loop-blocking guard if it ran on the loop."""
    await anyio.to_thread.run_sync(gc.collect)
