"""Settings of :class:`~miles_lite.engine.EngineClient`: timeouts, connection limits, body limits."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from miles_lite.engine.retry import RetryPolicy
from miles_lite.errors import ConfigError

__all__ = ["EngineClientConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineClientConfig:
    """Timeouts, connection limits and body limits of an engine client.

    Every wait is bounded: connecting by ``connect_timeout_s``, every socket read by
    ``read_timeout_s``, the whole exchange (waiting for a free pooled connection, sending,
    receiving the full body) by ``total_timeout_s``. Either of the last two may be ``None``,
    not both. Sizes are in bytes, times in seconds.

    Raises :class:`~miles_lite.errors.ConfigError` naming the field and the bad value.

    Usage: ``EngineClientConfig(total_timeout_s=120.0, max_body_bytes=1 << 30)``.
    """

    #: Time to open a TCP connection to an engine.
    connect_timeout_s: float = 10.0
    #: Longest silence while waiting for any bytes of the answer (headers or body). A
    #: diffusion engine sends nothing until its samples are done: keep this above the
    #: slowest generation. ``None``: only the total timeout bounds the wait.
    read_timeout_s: float | None = 600.0
    #: Whole exchange. ``None`` only when ``read_timeout_s`` is set.
    total_timeout_s: float | None = 1800.0
    #: Open connections across all engines.
    max_connections: int = 256
    #: Open connections to one engine (<= max_connections).
    max_connections_per_host: int = 64
    #: Largest body accepted. Larger bodies are refused with ``BodyTooLargeError``: before
    #: reading when Content-Length says so, else as soon as the limit is crossed.
    max_body_bytes: int = 4 << 30
    #: Largest piece read from the socket buffer at a time (also aiohttp's read buffer).
    read_chunk_bytes: int = 1 << 20
    #: Which failures are tried again, and the backoff between tries.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Extra headers sent with every request, as (name, value) pairs (e.g. an
    #: ``Authorization`` for a reward API); a tuple so that the config stays immutable.
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        _positive_time("connect_timeout_s", self.connect_timeout_s, optional=False)
        _positive_time("read_timeout_s", self.read_timeout_s, optional=True)
        _positive_time("total_timeout_s", self.total_timeout_s, optional=True)
        if self.total_timeout_s is None and self.read_timeout_s is None:
            raise ConfigError(
                "total_timeout_s may be None only when read_timeout_s is set;"
                " got total_timeout_s=None and read_timeout_s=None (a request could hang forever)"
            )
        for name in (
            "max_connections",
            "max_connections_per_host",
            "max_body_bytes",
            "read_chunk_bytes",
        ):
            _positive_int(name, getattr(self, name))
        if self.max_connections_per_host > self.max_connections:
            raise ConfigError(
                f"max_connections_per_host must be <= max_connections ({self.max_connections}),"
                f" got {self.max_connections_per_host!r}"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {self.retry!r}")
        if not isinstance(self.headers, tuple) or not all(
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(part, str) for part in pair)
            for pair in self.headers
        ):
            raise ConfigError(
                f"headers must be a tuple of (name, value) string pairs, got {self.headers!r}"
            )


def _positive_time(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        allowed = "a finite number of seconds > 0" + (" or None" if optional else "")
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be an int > 0, got {value!r}")
