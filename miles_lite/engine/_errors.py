"""Where aiohttp's exceptions become miles_lite's: the one translation point of the client.

Only aiohttp's own exception types are caught, so cancellation and the errors of a body
allocator pass through untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from miles_lite.errors import (
    ConfigError,
    EngineProtocolError,
    EngineTimeoutError,
    EngineUnavailableError,
)

__all__ = ["Attempt", "Progress", "translated", "truncated_message"]


class Progress:
    """How far an attempt got: what the error translation reports (truncated bodies)."""

    __slots__ = ("expected", "received")

    def __init__(self) -> None:
        self.expected: int | None = None
        self.received = 0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP exchange in progress: what its errors name (method, URL, path, rid, timeouts)."""

    method: str
    url: str
    path: str
    request_id: str | None
    timeout: aiohttp.ClientTimeout
    progress: Progress


@contextmanager
def translated(where: Attempt) -> Iterator[None]:
    """The one place where aiohttp's exceptions become miles_lite's (``raise ... from exc``).

    Only aiohttp's own exception types are caught, so cancellation and the allocator's
    errors pass through untouched.
    """
    ctx: dict[str, Any] = {"url": where.url, "request_id": where.request_id}
    try:
        yield
    # aiohttp's timeouts (ServerTimeoutError and its connect/read kinds) subclass
    # asyncio.TimeoutError; they must be matched before ClientConnectionError.
    except asyncio.TimeoutError as exc:
        timeout = EngineTimeoutError(_timeout_message(where, exc), **ctx)
        # Only a connect timeout is known to have sent nothing: never re-send a generation.
        timeout.retryable = isinstance(exc, aiohttp.ConnectionTimeoutError)
        raise timeout from exc
    except aiohttp.ClientPayloadError as exc:
        raise EngineProtocolError(f"{truncated_message(where)} ({exc})", **ctx) from exc
    except aiohttp.InvalidURL as exc:
        raise ConfigError(
            f"invalid engine URL {where.url!r} (path {where.path!r}): {exc}", **ctx
        ) from exc
    except aiohttp.ClientConnectorError as exc:
        # Refused, DNS, no route: the request never left, so it may be sent again.
        raise EngineUnavailableError(
            f"cannot reach the engine for {where.method} {where.path}:"
            f" {type(exc).__name__}: {exc}; is it running and listening there?",
            **ctx,
        ) from exc
    except aiohttp.ClientConnectionError as exc:
        if _body_not_written(exc):
            # The request body could not be written (typically a pooled keep-alive
            # connection to an engine that has since died): the engine never got a whole
            # request, so it cannot be generating it; sending it again is safe.
            raise EngineUnavailableError(
                f"the engine closed the connection before {where.method} {where.path} was"
                f" fully sent: {type(exc).__name__}: {exc}; it may be down",
                **ctx,
            ) from exc
        dropped = EngineUnavailableError(
            f"the engine dropped the connection during {where.method} {where.path}"
            f" after the request was sent: {type(exc).__name__}: {exc};"
            " not retried (the engine may have started generating)",
            **ctx,
        )
        dropped.retryable = False
        raise dropped from exc
    except aiohttp.ClientError as exc:
        raise EngineProtocolError(
            f"malformed answer to {where.method} {where.path}: {type(exc).__name__}: {exc}", **ctx
        ) from exc


def _body_not_written(exc: aiohttp.ClientConnectionError) -> bool:
    # aiohttp (3.9 to 3.14) raises this ClientOSError, and only this one, when writing the
    # request body fails; matched by its text because it has no type of its own.
    return isinstance(exc, aiohttp.ClientOSError) and str(exc.strerror or "").startswith(
        "Can not write request body"
    )


def _timeout_message(where: Attempt, exc: BaseException) -> str:
    timeout = where.timeout
    what = f"{where.method} {where.path}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"connecting for {what} took over {timeout.sock_connect} s (connect_timeout_s)"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return (
            f"no data for {timeout.sock_read} s during {what} after {where.progress.received}"
            " body bytes (read_timeout_s); raise it if generations are slower"
        )
    return f"{what} did not complete within {timeout.total} s (total timeout)"


def truncated_message(where: Attempt) -> str:
    """Says how much of a body arrived, and of how much (when Content-Length said)."""
    progress = where.progress
    if progress.expected is None:
        return f"truncated body: got {progress.received} bytes of a body without Content-Length"
    return f"truncated body: got {progress.received} of {progress.expected} bytes"
