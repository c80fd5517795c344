"""The one translator of transport failures into miles_lite's errors.

Every transport (aiohttp on the loop, ``http.client`` in a parser worker, the mock) first
says *what happened* as a :class:`Failure`, from its own library's exceptions, and then
:func:`engine_error` builds the typed error. Only this module sets ``retryable``, and only
for failures where the request is known never to have reached the engine (refused,
DNS, connect timeout, a body that could not be written): a generation is never sent twice.

A non-2xx answer becomes an ``EngineStatusError`` in :func:`status_error`. Through
SGLang's router (smg), an answer the router made itself carries ``x-smg-error-code``: it
is retryable only for the codes that say no engine got the request (the status alone
would mislead: smg's 504 ``call_upstream_timeout`` follows a request an engine took). An
engine's own answer passed through by the router names that engine
(``x-smg-routed-worker-id``) and keeps the engine rule (502/503/504 retryable).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from miles_lite.errors import (
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
)

__all__ = [
    "NEVER_SENT",
    "SMG_ERROR_HEADER",
    "SMG_NEVER_SENT",
    "SMG_WORKER_HEADER",
    "Attempt",
    "Failure",
    "Progress",
    "Timeouts",
    "engine_error",
    "status_error",
    "truncated_message",
]


class Failure(enum.Enum):
    """What went wrong in one HTTP exchange, whatever the transport."""

    #: Refused, DNS, no route: nothing reached the engine.
    UNREACHABLE = "unreachable"
    #: Connecting took too long: nothing reached the engine.
    CONNECT_TIMEOUT = "connect_timeout"
    #: The request could not be written whole (a pooled connection the engine had
    #: closed): the engine never got a whole request.
    NOT_SENT = "not_sent"
    #: The connection dropped after the request went out: the engine may be generating.
    DROPPED = "dropped"
    #: No data for the read timeout after the request went out.
    READ_TIMEOUT = "read_timeout"
    #: The whole exchange ran past the total timeout.
    TOTAL_TIMEOUT = "total_timeout"
    #: The body ended before its Content-Length.
    TRUNCATED = "truncated"
    #: The answer breaks HTTP itself (a bad status line, bad chunking).
    MALFORMED = "malformed"
    #: The URL cannot be used (no scheme, no host).
    INVALID_URL = "invalid_url"


#: Failures where nothing reached the engine: the only ones that may be sent again.
NEVER_SENT = frozenset({Failure.UNREACHABLE, Failure.CONNECT_TIMEOUT, Failure.NOT_SENT})

#: The header of an error SGLang's router (smg) answered itself, and of the engine it
#: routed to (on the engine's own answers).
SMG_ERROR_HEADER = "x-smg-error-code"
SMG_WORKER_HEADER = "x-smg-routed-worker-id"
#: smg error codes after which no engine got the request (smg 1.13: the engine refused
#: the connection, no engine is healthy, its admission queue is full or timed out). Every
#: other code (``call_upstream_request_error``: the engine dropped the connection after
#: taking the request; ``call_upstream_timeout``) may follow a generation that ran.
SMG_NEVER_SENT = frozenset(
    {
        "call_upstream_connection_failed",
        "no_available_workers",
        "admission_queue_full",
        "admission_queue_timeout",
    }
)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The bounds of one exchange, in seconds: connecting, each read, the whole of it."""

    connect_s: float | None
    read_s: float | None
    total_s: float | None


@dataclass(slots=True)
class Progress:
    """How far an exchange got: body bytes expected (Content-Length) and received."""

    expected: int | None = None
    received: int = 0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP exchange, as its errors name it."""

    method: str
    url: str
    path: str
    request_id: str | None
    timeouts: Timeouts
    progress: Progress = field(default_factory=Progress)


def engine_error(failure: Failure, where: Attempt, detail: str) -> MilesLiteError:
    """The typed error for ``failure`` in the exchange ``where``; ``detail`` says what the
    transport saw (its exception, in a few words). Retryable only when nothing was sent."""
    what = f"{where.method} {where.path}"
    ctx = {"url": where.url, "request_id": where.request_id}
    timeouts = where.timeouts
    error: MilesLiteError
    if failure is Failure.UNREACHABLE:
        error = EngineUnavailableError(
            f"cannot reach the engine for {what}: {detail}; is it running and listening there?",
            **ctx,
        )
    elif failure is Failure.CONNECT_TIMEOUT:
        error = EngineTimeoutError(
            f"connecting for {what} took over {timeouts.connect_s} s (connect_timeout_s)", **ctx
        )
    elif failure is Failure.NOT_SENT:
        error = EngineUnavailableError(
            f"the engine closed the connection before {what} was fully sent: {detail};"
            " it may be down",
            **ctx,
        )
    elif failure is Failure.DROPPED:
        error = EngineUnavailableError(
            f"the engine dropped the connection during {what} after the request was sent:"
            f" {detail}; not retried (the engine may have started generating)",
            **ctx,
        )
    elif failure is Failure.READ_TIMEOUT:
        error = EngineTimeoutError(
            f"no data for {timeouts.read_s} s during {what} after {where.progress.received}"
            " body bytes (read_timeout_s); raise it if generations are slower",
            **ctx,
        )
    elif failure is Failure.TOTAL_TIMEOUT:
        error = EngineTimeoutError(
            f"{what} did not complete within {timeouts.total_s} s (total timeout)", **ctx
        )
    elif failure is Failure.TRUNCATED:
        error = EngineProtocolError(f"{truncated_message(where)} ({detail})", **ctx)
    elif failure is Failure.MALFORMED:
        error = EngineProtocolError(f"malformed answer to {what}: {detail}", **ctx)
    else:
        error = ConfigError(
            f"invalid engine URL {where.url!r} (path {where.path!r}): {detail}", **ctx
        )
    error.retryable = failure in NEVER_SENT
    return error


def status_error(
    where: Attempt, status: int, reason: str, headers: Mapping[str, str], excerpt: str
) -> EngineStatusError:
    """The typed error of a non-2xx answer to the exchange ``where`` (see the module doc);
    ``excerpt`` is the start of its body."""
    what = f"{where.method} {where.path}"
    code = headers.get(SMG_ERROR_HEADER)
    worker = headers.get(SMG_WORKER_HEADER)
    if code is not None:
        never_sent = code in SMG_NEVER_SENT
        error = EngineStatusError(
            f"SGLang's router answered HTTP {status} {code!r} to {what}: {excerpt!r};"
            + (
                " no engine got the request (it may be sent again)"
                if never_sent
                else " an engine may have received it: not sent again"
            ),
            status=status,
            body_excerpt=excerpt,
            url=where.url,
            request_id=where.request_id,
        )
        error.retryable = never_sent
        return error
    if worker is not None and worker != where.url:
        # The engine's own answer: name it, so that an engine failing behind the router
        # does not count as the router failing.
        return EngineStatusError(
            f"engine {worker} (through SGLang's router at {where.url}) answered HTTP"
            f" {status} {reason} to {what}: {excerpt!r}",
            status=status,
            body_excerpt=excerpt,
            url=worker,
            request_id=where.request_id,
        )
    return EngineStatusError(
        f"engine answered HTTP {status} {reason} to {what}: {excerpt!r}",
        status=status,
        body_excerpt=excerpt,
        url=where.url,
        request_id=where.request_id,
    )


def truncated_message(where: Attempt) -> str:
    """Says how much of a body arrived, and of how much (when Content-Length said)."""
    progress = where.progress
    if progress.expected is None:
        return f"truncated body: got {progress.received} bytes of a body without Content-Length"
    return f"truncated body: got {progress.received} of {progress.expected} bytes"
