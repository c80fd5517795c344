"""The real transport: one aiohttp session, aiohttp's errors classified and translated once.

:func:`classify_aiohttp` says what an aiohttp exception means; every send and body read
goes through :func:`_translate`, so no aiohttp exception leaves this module. A large body
(:data:`IN_PLACE_MIN_BYTES` or more still to come) is received by the socket straight into
the caller's buffer (:mod:`miles_lite.engine.http.in_place`); its connection is closed
afterwards (its HTTP parser was bypassed); smaller bodies keep aiohttp's path and their
connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp
import anyio

from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.http._errors import Attempt, Failure, Timeouts, engine_error
from miles_lite.engine.http.in_place import InPlaceBody
from miles_lite.engine.http.transport import Request, ResponseStream

__all__ = ["IN_PLACE_MIN_BYTES", "AiohttpTransport", "classify_aiohttp"]

#: Longest time aclose() waits for the session's connections to close, in seconds.
_CLOSE_TIMEOUT_S = 5.0
#: Distinct sets of bounds whose aiohttp timeout objects are kept.
_MAX_TIMEOUTS = 64
#: How long an idle pooled connection is kept, in seconds: under the 5 s after which
#: uvicorn (SGLang's HTTP server) closes an idle keep-alive connection. aiohttp's 15 s
#: default reused connections the server was closing: the chaos tier lost a real
#: pause_generation sent 5.0 s after the connection's last request (ServerDisconnected).
KEEPALIVE_S = 4.0
# identity: Content-Length must be the body's size, and compressed bodies would need a
# decompression pass on the loop.
_GET_HEADERS = {"Accept-Encoding": "identity"}
_JSON_HEADERS = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
#: Bodies with at least this many bytes still to come are received straight into the
#: caller's buffer, and their connection is closed after: a new loopback connection
#: (~0.1 ms) is cheap next to copying 4 MiB twice more (aiohttp's read bytes, its parser's
#: slice, then into the buffer). Text answers stay under it and keep their connection.
IN_PLACE_MIN_BYTES = 4 << 20


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

    def _take_connection(self, view: memoryview, pos: int) -> InPlaceBody | None:
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
        return InPlaceBody(transport, handler, view, pos, chunk, self._attempt, self._started)

    def release(self) -> None:
        if self._in_place:
            self._response.close()
        else:
            self._response.release()

    def close(self) -> None:
        self._response.close()


class AiohttpTransport:
    """The real transport: two aiohttp sessions with the client config's read buffer and
    headers, made on first use inside the running event loop: one for generations
    (``max_connections``, ``max_connections_per_host``), one for control calls
    (``control_connections_per_host``), so that a control call never queues for a
    connection behind generations (a pause holds them open until the update is done)."""

    def __init__(self, config: EngineClientConfig) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        self._control: aiohttp.ClientSession | None = None
        # One aiohttp timeout object per set of bounds (the client has one, plus a few
        # per control call): made once, not per request.
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}
        #: Bodies received straight into the caller's buffer (see IN_PLACE_MIN_BYTES).
        self.bodies_in_place = 0

    @property
    def config(self) -> EngineClientConfig:
        """The settings this transport was made with."""
        return self._config

    def _open_session(self, control: bool) -> aiohttp.ClientSession:
        session = self._control if control else self._session
        if session is None:
            config = self._config
            per_host = (
                config.control_connections_per_host if control else config.max_connections_per_host
            )
            connector = aiohttp.TCPConnector(
                limit=config.max_connections,
                limit_per_host=per_host,
                keepalive_timeout=KEEPALIVE_S,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                read_bufsize=config.read_chunk_bytes,
                raise_for_status=False,
                trust_env=False,
                headers=dict(config.headers),
            )
            if control:
                self._control = session
            else:
                self._session = session
        return session

    async def send(self, request: Request) -> ResponseStream:
        """Send ``request``; the answer once its headers are in (see :class:`AsyncTransport`)."""
        if request.control:
            session = self._control or self._open_session(True)
        else:
            session = self._session or self._open_session(False)
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
        """Close both sessions and their connections (shielded, at most 5 s)."""
        sessions = [s for s in (self._session, self._control) if s is not None]
        self._session = self._control = None
        with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
            for session in sessions:
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
