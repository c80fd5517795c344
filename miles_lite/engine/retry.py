"""When and how often a failed engine call is tried again.

Only errors whose ``retryable`` attribute is true are retried (see :mod:`miles_lite.errors`):
what never reached the engine (connection refused, DNS, connect timeout) and HTTP
502/503/504 answers. A generation is never sent twice: a read timeout, a reset after the
request went out, a truncated or malformed answer, a 4xx or 500, a closed client and
anything that is not a :class:`MilesLiteError` end the call at once (an engine cannot
abort a diffusion generation, and a text one would run twice until aborted).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from miles_lite.errors import ConfigError

__all__ = ["RetryPolicy", "retry_call"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How many times a retryable engine error is tried again, and how long to wait between.

    The wait before retry ``k`` (1-based) is ``min(backoff_max_s, backoff_initial_s *
    2**(k-1))``, scaled by a random factor in ``[1 - jitter, 1 + jitter]`` and capped at
    ``backoff_max_s`` again. ``max_attempts`` counts the first try: 1 means never retry.

    Raises :class:`~miles_lite.errors.ConfigError` naming the field on a bad value.

    Usage: ``RetryPolicy(max_attempts=5, backoff_initial_s=0.2)``.
    """

    #: Tries in all, the first one included (>= 1).
    max_attempts: int = 3
    #: Wait before the first retry, in seconds (>= 0).
    backoff_initial_s: float = 0.1
    #: Longest wait between two tries, in seconds (>= backoff_initial_s).
    backoff_max_s: float = 2.0
    #: Relative random spread of each wait, in [0, 1]: 0.1 means +-10%.
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        for name in ("backoff_initial_s", "backoff_max_s", "jitter"):
            value = getattr(self, name)
            if not _is_finite_number(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(
                f"backoff_max_s must be >= backoff_initial_s ({self.backoff_initial_s!r}),"
                f" got {self.backoff_max_s!r}"
            )
        if self.jitter > 1:
            raise ConfigError(f"jitter must be in [0, 1], got {self.jitter!r}")

    def backoff_s(self, retry: int, rand: float) -> float:
        """The wait in seconds before retry number ``retry`` (1-based).

        ``rand`` is a uniform random number in ``[0, 1)`` that sets the jitter; pure
        function, never blocks.
        """
        if retry < 1:
            raise ValueError(f"retry is 1-based, got {retry!r}")
        # Cap the exponent first: 2**retry overflows a float long before retries run out.
        base = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(retry - 1, 60))
        spread = 1.0 + self.jitter * (2.0 * rand - 1.0)
        return max(0.0, min(self.backoff_max_s, base * spread))

    @staticmethod
    def should_retry(error: BaseException) -> bool:
        """Whether ``error`` may be retried: only when its ``retryable`` attribute is true."""
        return isinstance(error, Exception) and getattr(error, "retryable", False) is True


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
            if attempt >= policy.max_attempts or not policy.should_retry(exc):
                raise
            delay = policy.backoff_s(attempt, rand())
            if on_retry is not None:
                on_retry(attempt, exc, delay)
        await anyio.sleep(delay)
        attempt += 1


def _is_finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
