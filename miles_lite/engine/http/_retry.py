"""The client's retry loop (the same engine again): try again what a
:class:`~miles_lite.engine.config.RetryPolicy` allows. ``Router.call`` writes out its own
(another engine each time, on the hot path); both ask ``RetryPolicy.retry_delay``.

Only errors whose ``retryable`` attribute is true are retried (see :mod:`miles_lite.errors`):
what never reached the engine (connection refused, DNS, connect timeout) and HTTP
502/503/504 answers. A generation is never sent twice: a read timeout, a reset after the
request went out, a truncated or malformed answer, a 4xx or 500, a closed client, no
healthy engine within the router's wait, and anything that is not a
:class:`MilesLiteError` end the call at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from miles_lite.engine.config import RetryPolicy

__all__ = ["retry_call"]

T = TypeVar("T")


async def retry_call(
    policy: RetryPolicy,
    fn: Callable[[], Awaitable[T]],
    *,
    rand: Callable[[], float],
    on_retry: Callable[[int, Exception, float], None] | None = None,
) -> T:
    """Await ``fn()`` until it returns, retrying retryable errors under ``policy``.

    ``rand`` gives uniform numbers in ``[0, 1)`` for the jitter (pass a
    ``random.Random().random``). ``on_retry(retry, error, delay_s)`` is called before each
    wait. Raises the last error unchanged once it is not retryable or ``max_attempts``
    tries were made. Cancellation (also during the backoff sleep) propagates at once and is
    never retried.
    """
    attempt = 1
    while True:
        try:
            return await fn()
        except Exception as exc:
            delay = policy.retry_delay(attempt, exc, rand)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(attempt, exc, delay)
        await anyio.sleep(delay)
        attempt += 1
