"""The seam between the engine client and HTTP: one exchange at a time, errors translated.

:class:`AsyncTransport` sends one request and gives back a :class:`ResponseStream` whose
body is read piece by piece, or straight into the caller's buffer; every failure arrives
already translated (:mod:`miles_lite.engine._errors`). :class:`AiohttpTransport` is the
real one; :class:`MockTransport` answers from a handler function, for unit tests of the
client and the router without a server (httpx's ``MockTransport``).

A large body (:data:`IN_PLACE_MIN_BYTES` or more still to come) is received by the socket
straight into the caller's buffer: once aiohttp has parsed the head, the connection's
transport is handed a buffered protocol whose buffer is the caller's view (``recv_into``),
so no bytes object is made and copied per read. Its connection is closed afterwards (its
HTTP parser was bypassed); smaller bodies keep aiohttp's path and their connection.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import anyio
from multidict import CIMultiDict, CIMultiDictProxy

from miles_lite.engine._errors import Attempt, Failure, Progress, Timeouts, engine_error
from miles_lite.engine.config import EngineClientConfig

__all__ = [
    "IN_PLACE_MIN_BYTES",
    "AiohttpTransport",
    "AsyncTransport",
    "MockFailure",
    "MockResponse",
    "MockTransport",
    "Request",
    "ResponseStream",
    "classify_aiohttp",
]

#: Longest time aclose() waits for the session's connections to close, in seconds.
_CLOSE_TIMEOUT_S = 5.0
#: Distinct sets of bounds whose aiohttp timeout objects are kept.
_MAX_TIMEOUTS = 64
# identity: Content-Length must be the body's size, and compressed bodies would need a
# decompression pass on the loop.
_GET_HEADERS = {"Accept-Encoding": "identity"}
_JSON_HEADERS = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
#: Bodies with at least this many bytes still to come are received straight into the
#: caller's buffer, and their connection is closed after: a new loopback connection
#: (~0.1 ms) is cheap next to copying 4 MiB twice more (aiohttp's read bytes, its parser's
#: slice, then into the buffer). Text answers stay under it and keep their connection.
IN_PLACE_MIN_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a transport sends it: ``attempt`` names it in errors; ``body`` is
    JSON bytes (``None``: no body, a GET); ``headers`` are this request's own (a sticky
    key for SGLang's router), sent over the client's."""

    attempt: Attempt
    body: bytes | None = None
    headers: Mapping[str, str] | None = None

    @property
    def method(self) -> str:
        return self.attempt.method

    @property
    def url(self) -> str:
        return self.attempt.url

    @property
    def path(self) -> str:
        return self.attempt.path


class ResponseStream(Protocol):
    """An answer whose headers arrived; its body is read with :meth:`read`."""

    @property
    def status(self) -> int:
        """The HTTP status."""
        ...

    @property
    def reason(self) -> str:
        """The status line's reason phrase."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The response headers (case-insensitive)."""
        ...

    @property
    def content_type(self) -> str:
        """The media type without parameters."""
        ...

    @property
    def content_length(self) -> int | None:
        """The Content-Length, or None."""
        ...

    async def read(self, n: int) -> bytes:
        """At most ``n`` body bytes already received (``b""`` at the end); raises
        translated errors (a truncated body, a read timeout)."""
        ...

    async def read_into(self, view: memoryview) -> int:
        """Fill ``view`` with the body's next bytes; how many were written, fewer than
        ``len(view)`` only where the body ended. Counts them in the attempt's progress;
        raises translated errors. Nothing is written into ``view`` after it returns."""
        ...

    def release(self) -> None:
        """The body was read whole: the connection may serve another request."""
        ...

    def close(self) -> None:
        """The body was not read whole: drop the connection."""
        ...


class AsyncTransport(Protocol):
    """Sends one request; every failure comes out as a miles_lite error, translated once."""

    async def send(self, request: Request) -> ResponseStream:
        """Send ``request`` and return once the answer's headers are in."""
        ...

    async def aclose(self) -> None:
        """Close every connection (shielded, bounded). Idempotent."""
        ...


def classify_aiohttp(exc: BaseException) -> tuple[Failure, str] | None:
    """What an aiohttp exception means (:class:`Failure`) and a few words of it; ``None``
    for anything that is not aiohttp's (cancellation, the allocator's errors)."""
    detail = f"{type(exc).__name__}: {exc}"
    # aiohttp's timeouts (ServerTimeoutError and its connect/read kinds) subclass
    # asyncio.TimeoutError; they must be matched before ClientConnectionError.
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return Failure.CONNECT_TIMEOUT, detail
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return Failure.READ_TIMEOUT, detail
    if isinstance(exc, asyncio.TimeoutError):
        return Failure.TOTAL_TIMEOUT, detail
    if isinstance(exc, aiohttp.ClientPayloadError):
        return Failure.TRUNCATED, detail
    if isinstance(exc, aiohttp.InvalidURL):
        return Failure.INVALID_URL, detail
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Failure.UNREACHABLE, detail
    if isinstance(exc, aiohttp.ClientConnectionError):
        # aiohttp (3.9 to 3.14) raises this ClientOSError, and only this one, when writing
        # the request body fails; matched by its text because it has no type of its own.
        if isinstance(exc, aiohttp.ClientOSError) and str(exc.strerror or "").startswith(
            "Can not write request body"
        ):
            return Failure.NOT_SENT, detail
        return Failure.DROPPED, detail
    if isinstance(exc, aiohttp.ClientError):
        return Failure.MALFORMED, detail
    return None


#: What aiohttp raises for a failed exchange (translated by :func:`_translate`).
_AIOHTTP_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def _translate(exc: BaseException, attempt: Attempt) -> BaseException:
    """The miles_lite error for an aiohttp failure of ``attempt`` (raise it ``from exc``).

    A plain ``try/except`` at each call site rather than a context manager: this runs
    around every send and every body read."""
    kind = classify_aiohttp(exc)
    if kind is None:  # pragma: no cover - every ClientError is classified
        return exc
    return engine_error(kind[0], attempt, kind[1])


class _AiohttpStream:
    __slots__ = ("_attempt", "_in_place", "_response", "_started", "_transport")

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        attempt: Attempt,
        started: float,
        transport: AiohttpTransport,
    ) -> None:
        self._response = response
        self._attempt = attempt
        self._started = started  # time.monotonic() when the request was sent
        self._transport = transport
        self._in_place = False

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def reason(self) -> str:
        return self._response.reason or ""

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    @property
    def content_type(self) -> str:
        return self._response.content_type

    @property
    def content_length(self) -> int | None:
        return self._response.content_length

    async def read(self, n: int) -> bytes:
        try:
            return await self._response.content.read(n)
        except _AIOHTTP_ERRORS as exc:
            raise _translate(exc, self._attempt) from exc

    async def read_into(self, view: memoryview) -> int:
        content = self._response.content
        progress = self._attempt.progress
        nbytes = len(view)
        pos = 0
        try:
            while pos < nbytes:
                # What aiohttp already holds first (it never waits); then, for a large
                # rest, the socket straight into the view.
                chunk = content.read_nowait(nbytes - pos)
                if not chunk:
                    if content.at_eof():
                        break
                    if nbytes - pos >= IN_PLACE_MIN_BYTES:
                        receiver = self._take_connection(view, pos)
                        if receiver is not None:
                            return await receiver.receive()
                    chunk = await content.read(nbytes - pos)
                    if not chunk:
                        break
                end = pos + len(chunk)
                view[pos:end] = chunk
                progress.received += end - pos
                pos = end
        except _AIOHTTP_ERRORS as exc:
            raise _translate(exc, self._attempt) from exc
        return pos

    def _take_connection(self, view: memoryview, pos: int) -> _InPlaceBody | None:
        """A receiver of the rest of the body into ``view[pos:]`` over this response's
        connection, or None where the connection cannot be taken (TLS, already closing)."""
        connection = self._response.connection
        if connection is None:
            return None
        transport, handler = connection.transport, connection.protocol
        if (
            not isinstance(transport, asyncio.Transport)
            or handler is None
            or transport.is_closing()
            or transport.get_extra_info("sslcontext") is not None
        ):
            return None
        self._in_place = True  # the connection's parser was bypassed: never reused
        owner = self._transport
        owner.bodies_in_place += 1
        chunk = owner.config.read_chunk_bytes
        return _InPlaceBody(transport, handler, view, pos, chunk, self._attempt, self._started)

    def release(self) -> None:
        if self._in_place:
            self._response.close()
        else:
            self._response.release()

    def close(self) -> None:
        self._response.close()


#: Where a detached receiver's socket reads go (none should come: the transport is paused).
_SCRATCH = bytearray(1 << 16)


class _InPlaceBody(asyncio.BufferedProtocol):
    """The rest of one body, received by the socket straight into a view.

    Set as the connection's protocol in place of aiohttp's ``handler`` (which still gets
    ``connection_lost``, so aiohttp's bookkeeping ends as for any closed connection). It
    keeps the exchange's bounds itself: the read timeout (since the last bytes) and the
    total timeout (since the request was sent). Each socket read takes at most ``chunk``
    bytes (the client's ``read_chunk_bytes``), so one callback never holds the loop long. On every way out of :meth:`receive` it
    stops reading and lets go of the view: nothing is written there afterwards.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        handler: asyncio.BaseProtocol,
        view: memoryview,
        pos: int,
        chunk: int,
        attempt: Attempt,
        started: float,
    ) -> None:
        self._transport = transport
        self._chunk = chunk
        self._handler = handler
        self._view: memoryview | None = view
        self._pos = pos
        self._end = len(view)
        self._attempt = attempt
        self._progress: Progress = attempt.progress
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = self._loop.create_future()
        timeouts = attempt.timeouts
        self._read_s = timeouts.read_s
        self._deadline = None if timeouts.total_s is None else started + timeouts.total_s
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    async def receive(self) -> int:
        """Receive until the view is full or the body ends; the bytes written in all."""
        transport = self._transport
        transport.set_protocol(self)
        transport.resume_reading()  # aiohttp pauses it while its own buffer is full
        self._arm(time.monotonic())
        try:
            await self._done
        finally:
            self._view = None
            if self._timer is not None:
                self._timer.cancel()
            transport.pause_reading()
        return self._pos

    # -- the transport's calls -------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        view = self._view
        if view is None:
            return _SCRATCH
        return view[self._pos : self._pos + self._chunk]

    def buffer_updated(self, nbytes: int) -> None:
        if self._view is None:
            return
        self._pos += nbytes
        self._progress.received += nbytes
        self._last = time.monotonic()
        if self._pos >= self._end:
            self._transport.pause_reading()
            self._finish(None)

    def eof_received(self) -> bool:
        self._finish(None)  # short: the caller sees the body ended early
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(None)
        self._handler.connection_lost(exc)

    # -- bounds ------------------------------------------------------------------------

    def _arm(self, now: float) -> None:
        due = [self._deadline] if self._deadline is not None else []
        if self._read_s is not None:
            due.append(self._last + self._read_s)
        if due:
            self._timer = self._loop.call_later(max(0.0, min(due) - now), self._check)

    def _check(self) -> None:
        now = time.monotonic()
        if self._deadline is not None and now >= self._deadline:
            self._finish(engine_error(Failure.TOTAL_TIMEOUT, self._attempt, "total timeout"))
        elif self._read_s is not None and now - self._last >= self._read_s:
            self._finish(engine_error(Failure.READ_TIMEOUT, self._attempt, "no body bytes"))
        else:
            self._arm(now)

    def _finish(self, error: BaseException | None) -> None:
        if self._done.done():
            return
        if error is None:
            self._done.set_result(None)
        else:
            self._done.set_exception(error)


class AiohttpTransport:
    """The real transport: one aiohttp session with the client config's connection limits,
    read buffer and headers, made on first use inside the running event loop."""

    def __init__(self, config: EngineClientConfig) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        # One aiohttp timeout object per set of bounds (the client has one, plus a few
        # per control call): made once, not per request.
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}
        #: Bodies received straight into the caller's buffer (see IN_PLACE_MIN_BYTES).
        self.bodies_in_place = 0

    @property
    def config(self) -> EngineClientConfig:
        """The settings this transport was made with."""
        return self._config

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            config = self._config
            connector = aiohttp.TCPConnector(
                limit=config.max_connections, limit_per_host=config.max_connections_per_host
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                read_bufsize=config.read_chunk_bytes,
                raise_for_status=False,
                trust_env=False,
                headers=dict(config.headers),
            )
        return self._session

    async def send(self, request: Request) -> ResponseStream:
        """Send ``request``; the answer once its headers are in (see :class:`AsyncTransport`)."""
        session = self._session or self._open_session()
        attempt = request.attempt
        timeout = self._timeouts.get(attempt.timeouts)
        if timeout is None:
            if len(self._timeouts) >= _MAX_TIMEOUTS:
                self._timeouts.clear()  # callers passing ever new timeout_s values
            timeout = self._timeouts[attempt.timeouts] = _client_timeout(attempt.timeouts)
        headers = _GET_HEADERS if request.body is None else _JSON_HEADERS
        if request.headers:
            headers = {**headers, **request.headers}
        started = time.monotonic()
        try:
            response = await session.request(
                attempt.method,
                _join(attempt.url, attempt.path),
                data=request.body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except _AIOHTTP_ERRORS as exc:
            raise _translate(exc, attempt) from exc
        return _AiohttpStream(response, attempt, started, self)

    async def aclose(self) -> None:
        """Close the session and its connections (shielded, at most 5 s)."""
        session, self._session = self._session, None
        if session is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                await session.close()


def _client_timeout(timeouts: Timeouts) -> aiohttp.ClientTimeout:
    # sock_connect, not connect: aiohttp's `connect` also counts the wait for a free
    # pooled connection, which under load is queueing, not an engine failure.
    return aiohttp.ClientTimeout(
        total=timeouts.total_s, sock_connect=timeouts.connect_s, sock_read=timeouts.read_s
    )


def _join(url: str, path: str) -> str:
    if not path:
        return url
    return url.rstrip("/") + "/" + path.lstrip("/")


# -- the mock ------------------------------------------------------------------------------


class MockFailure(Exception):
    """Raised by a :class:`MockTransport` handler to make the exchange fail as ``failure``
    says (before any answer: refused, a timeout after sending, a dropped connection)."""

    def __init__(self, failure: Failure, detail: str = "mock failure") -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


@dataclass
class MockResponse:
    """What a :class:`MockTransport` handler answers: ``status``, ``body``, headers.

    ``content_length`` defaults to the body's size (``None``: no Content-Length, as a
    chunked answer). ``fail_after``: the body breaks after that many bytes, with
    ``failure`` (a truncated body, a read timeout).
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    content_length: int | None = -1
    fail_after: int | None = None
    failure: Failure = Failure.TRUNCATED

    @classmethod
    def json(cls, payload: object, status: int = 200) -> MockResponse:
        """An answer holding ``payload`` as JSON."""
        from miles_lite._core import json as _json

        return cls(status=status, body=_json.dumps(payload, strict=False))


Handler = Callable[[Request], "MockResponse | Awaitable[MockResponse]"]


class _MockStream:
    def __init__(self, response: MockResponse, attempt: Attempt) -> None:
        self._response = response
        self._attempt = attempt
        self._pos = 0
        length = response.content_length
        self._length = len(response.body) if length == -1 else length

    @property
    def status(self) -> int:
        return self._response.status

    @property
    def reason(self) -> str:
        return "mock"

    @property
    def headers(self) -> Mapping[str, str]:
        # Case-insensitive, as aiohttp's: a handler may spell a header either way.
        headers = CIMultiDict({"Content-Type": self._response.content_type})
        headers.update(self._response.headers)
        if self._length is not None:
            headers["Content-Length"] = str(self._length)
        return CIMultiDictProxy(headers)

    @property
    def content_type(self) -> str:
        return self._response.content_type

    @property
    def content_length(self) -> int | None:
        return self._length

    async def read(self, n: int) -> bytes:
        await anyio.lowlevel.checkpoint()
        response = self._response
        end = min(len(response.body), self._pos + n)
        if response.fail_after is not None and end > response.fail_after:
            if self._pos >= response.fail_after:
                raise engine_error(response.failure, self._attempt, "mock failure")
            end = response.fail_after
        chunk = response.body[self._pos : end]
        self._pos = end
        return chunk

    async def read_into(self, view: memoryview) -> int:
        pos = 0
        while pos < len(view):
            chunk = await self.read(len(view) - pos)
            if not chunk:
                break
            view[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
            self._attempt.progress.received += len(chunk)
        return pos

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class MockTransport:
    """A transport answering from ``handler(request)`` (sync or async), without a socket.

    ``requests`` lists every request the handler saw (what "the engine received").
    A handler raising :class:`MockFailure` makes the exchange fail as that failure.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.requests: list[Request] = []

    async def send(self, request: Request) -> ResponseStream:
        """Answer ``request`` from the handler (see the class docstring)."""
        await anyio.lowlevel.checkpoint()
        self.requests.append(request)
        try:
            answer = self._handler(request)
            if inspect.isawaitable(answer):
                answer = await answer
        except MockFailure as exc:
            raise engine_error(exc.failure, request.attempt, exc.detail) from exc
        assert isinstance(answer, MockResponse)
        return _MockStream(answer, request.attempt)

    async def aclose(self) -> None:
        """Nothing to close."""
