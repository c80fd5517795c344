"""Every failure of either transport is translated, once, to the right miles_lite error.

In the style of httpx's exported-exceptions test: a new aiohttp exception class that the
translation would let through raw fails here, not in a user's rollout. Only failures
where nothing reached the engine are retryable, whichever transport saw them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import pytest

from miles_lite.engine.http._errors import NEVER_SENT, Attempt, Failure, Timeouts, engine_error
from miles_lite.engine.http.aiohttp_transport import _AIOHTTP_ERRORS, _translate
from miles_lite.errors import (
    ConfigError,
    EngineProtocolError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
)

#: Exported by aiohttp, but never raised by a client request (websocket and multipart
#: parsing, warnings, the stream-end marker).
NOT_RAISED_BY_REQUESTS = {
    "WebSocketError",
    "BadContentDispositionHeader",
    "BadContentDispositionParam",
    "EofStream",
    "WSMessageTypeError",
}


@contextmanager
def translated(where: Attempt) -> Iterator[None]:
    """What AiohttpTransport's send and read do around aiohttp."""
    try:
        yield
    except _AIOHTTP_ERRORS as exc:
        raise _translate(exc, where) from exc


WHERE = Attempt(
    "POST", "http://127.0.0.1:1", "/generate", "rid-1", Timeouts(connect_s=1, read_s=1, total_s=5)
)


def exported_exceptions() -> list[str]:
    return sorted(
        name
        for name in aiohttp.__all__
        if isinstance(getattr(aiohttp, name), type)
        and issubclass(getattr(aiohttp, name), BaseException)
    )


@pytest.mark.parametrize("name", exported_exceptions())
def test_every_exported_exception_is_translated(name: str) -> None:
    cls = getattr(aiohttp, name)
    if name in NOT_RAISED_BY_REQUESTS:
        assert not issubclass(cls, aiohttp.ClientError | asyncio.TimeoutError)
        return
    # Whatever the subclass, the translation catches it: a ClientError or a timeout.
    assert issubclass(cls, _AIOHTTP_ERRORS), name


def raise_through(exc: BaseException) -> MilesLiteError:
    with pytest.raises(MilesLiteError) as caught, translated(WHERE):
        raise exc
    assert caught.value.__cause__ is exc
    assert caught.value.url == WHERE.url and caught.value.request_id == "rid-1"
    return caught.value


class _Key:
    host, port, ssl = "127.0.0.1", 1, None


@pytest.mark.parametrize(
    ("exc", "kind", "retryable"),
    [
        (aiohttp.ConnectionTimeoutError(), EngineTimeoutError, True),
        (aiohttp.SocketTimeoutError(), EngineTimeoutError, False),
        (asyncio.TimeoutError(), EngineTimeoutError, False),
        (
            aiohttp.ClientConnectorError(_Key(), OSError(111, "refused")),
            EngineUnavailableError,
            True,
        ),  # type: ignore[arg-type]
        (
            aiohttp.ClientOSError(32, "Can not write request body for x"),
            EngineUnavailableError,
            True,
        ),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), EngineUnavailableError, False),
        (aiohttp.ServerDisconnectedError(), EngineUnavailableError, False),
        (aiohttp.ClientConnectionResetError(), EngineUnavailableError, False),
        (aiohttp.ClientPayloadError("cut"), EngineProtocolError, False),
        (aiohttp.InvalidURL("nope"), ConfigError, False),
        (aiohttp.ClientError("odd"), EngineProtocolError, False),
    ],
)
def test_each_kind_maps_to_its_error_and_retryability(
    exc: BaseException, kind: type[MilesLiteError], retryable: bool
) -> None:
    error = raise_through(exc)
    assert type(error) is kind
    if not isinstance(error, ConfigError):
        assert bool(getattr(error, "retryable", False)) is retryable


def test_other_errors_pass_through_untouched() -> None:
    with pytest.raises(KeyError), translated(WHERE):
        raise KeyError("allocator")


@pytest.mark.parametrize("failure", list(Failure))
def test_only_what_never_reached_the_engine_is_retryable(failure: Failure) -> None:
    error = engine_error(failure, WHERE, "detail")
    assert (error.url, error.request_id) == (WHERE.url, "rid-1")
    assert error.retryable is (failure in NEVER_SENT)
    assert {Failure.UNREACHABLE, Failure.CONNECT_TIMEOUT, Failure.NOT_SENT} == NEVER_SENT


def test_no_error_class_is_retryable_by_default() -> None:
    # The default errs toward not sending twice: a transport that forgets to say
    # "nothing was sent" gets a non-retryable error.
    for cls in (EngineUnavailableError, EngineTimeoutError, EngineProtocolError):
        assert cls("x").retryable is False
