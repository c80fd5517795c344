"""The engine exchange made inside a worker process (``fetch_in_parser``): blocking
``http.client``, the body read straight into memory the caller gives.

The second transport to the engines, with the same limits (derived from the client's
:class:`~miles_lite.engine.config.EngineClientConfig` by :meth:`BlockingRequest.from_config`)
and the same error translation (:func:`~miles_lite.engine.http._errors.engine_error`): its own
``http.client``/socket failures are classified by the phase they happened in, so only a
request that never reached the engine is retryable. It never retries by itself: the
caller (the router's one retry loop) decides. Plain HTTP only.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from miles_lite._core import json as _json
from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.http._body import EXCERPT_BYTES
from miles_lite.engine.http._errors import Attempt, Failure, Progress, Timeouts, engine_error
from miles_lite.errors import BodyTooLargeError, ConfigError, EngineProtocolError, EngineStatusError

__all__ = ["BlockingClient", "BlockingRequest", "BlockingResponse"]


@dataclass(frozen=True, slots=True)
class BlockingRequest:
    """A POST a worker makes itself; sizes in bytes, times in seconds (``timeouts``: as
    the engine client's: connect, each read, the whole exchange)."""

    url: str
    path: str
    body: bytes
    request_id: str | None
    timeouts: Timeouts
    max_body_bytes: int
    chunk_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme != "http":
            raise ConfigError(
                f"fetch_in_parser speaks plain HTTP: the engine URL must be http://, got"
                f" {self.url!r}; use the engine client (fetch_in_parser=False) for TLS"
            )

    @classmethod
    def from_config(
        cls,
        config: EngineClientConfig,
        url: str,
        path: str,
        payload: object,
        *,
        request_id: str | None,
    ) -> BlockingRequest:
        """The request for ``payload`` (JSON) under the limits of ``config``."""
        return cls(
            url=url,
            path=path,
            body=_json.dumps(payload),
            request_id=request_id,
            timeouts=Timeouts(
                connect_s=config.connect_timeout_s,
                read_s=config.read_timeout_s,
                total_s=config.total_timeout_s,
            ),
            max_body_bytes=config.max_body_bytes,
            chunk_bytes=config.read_chunk_bytes,
        )


@dataclass(frozen=True, slots=True)
class BlockingResponse:
    """A 2xx answer read whole into ``view`` (what ``allocate`` gave); ``response_at`` /
    ``read_at``: ``time.monotonic()`` when the headers and the last byte arrived."""

    status: int
    content_type: str
    view: memoryview
    response_at: float
    read_at: float


class _Cut(Exception):
    """The deadline of the whole exchange passed (the socket was shut down)."""


class BlockingClient:
    """One worker process's connections to engines, kept alive between requests."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def close(self) -> None:
        """Close every connection."""
        for key in list(self._connections):
            self._drop(key)

    def post_into(
        self,
        request: BlockingRequest,
        allocate: Callable[[int], memoryview],
        *,
        accept: Callable[[str], object] | None = None,
    ) -> BlockingResponse:
        """POST ``request`` and read the answer's body into ``allocate(length)``.

        ``accept(content_type)`` may refuse a 2xx answer before its body is read (it
        raises); ``allocate`` may raise too: their errors propagate unchanged (the
        connection is dropped).
        Raises ``EngineStatusError`` (non-2xx), ``EngineUnavailableError``,
        ``EngineTimeoutError``, ``EngineProtocolError`` (no Content-Length, truncated),
        ``BodyTooLargeError``, each with the URL and request id, retryable only when the
        request never reached the engine.
        """
        split = urlsplit(request.url)
        key = (split.hostname or "127.0.0.1", split.port or 80)
        exchange = _Exchange(request)
        try:
            conn = self._connection(key)
            exchange.send(conn)
            resp = conn.getresponse()
            exchange.check_cut()
            response_at = time.monotonic()
            exchange.phase = "body"
            content_type = (resp.getheader("Content-Type", "") or "").split(";")[0].strip()
            length = exchange.body_length(resp)
            if accept is not None:
                accept(content_type)
            view = allocate(length)
            exchange.read_body(conn.sock, resp, view)
            read_at = time.monotonic()
            if conn.sock is None or _has_pending(conn.sock):
                # Bytes past Content-Length (or a close): this connection's next answer
                # could be anything; never reuse it.
                self._drop(key)
        except _Cut as exc:
            self._drop(key)
            raise engine_error(Failure.TOTAL_TIMEOUT, exchange.attempt, "deadline passed") from exc
        except (TimeoutError, http.client.HTTPException, OSError) as exc:
            self._drop(key)
            failure = _classify(exc, exchange.phase, exchange.cut.is_set())
            detail = f"{type(exc).__name__}: {exc}"
            raise engine_error(failure, exchange.attempt, detail) from exc
        except BaseException:
            self._drop(key)
            raise
        finally:
            exchange.stop_timer()
        return BlockingResponse(resp.status, content_type, view, response_at, read_at)

    def _connection(self, key: tuple[str, int]) -> http.client.HTTPConnection:
        conn = self._connections.get(key)
        if conn is not None and conn.sock is not None and _has_pending(conn.sock):
            # Bytes (or EOF) nobody asked for: never read them as the next answer.
            self._drop(key)
            conn = None
        if conn is None:
            conn = http.client.HTTPConnection(*key)
            self._connections[key] = conn
        return conn

    def _drop(self, key: tuple[str, int]) -> None:
        conn = self._connections.pop(key, None)
        if conn is not None:
            conn.close()


class _Exchange:
    """One POST of :meth:`BlockingClient.post_into`, step by step: its bounds (each socket
    operation waits at most its own timeout and never past the exchange's deadline), the
    phase it is in (what a failure means), and a timer that cuts the socket at the
    deadline."""

    def __init__(self, request: BlockingRequest) -> None:
        self.request = request
        timeouts = request.timeouts
        self.attempt = Attempt(
            "POST", request.url, request.path, request.request_id, timeouts, Progress()
        )
        self.total = timeouts.total_s or math.inf
        self.deadline = time.monotonic() + self.total
        self.cut = threading.Event()
        self.conn: http.client.HTTPConnection | None = None
        self.phase = "connect"
        self._timer: threading.Timer | None = None

    def bounded(self, wait: float | None) -> float | None:
        """``wait`` (None: no bound of its own) cut to what is left of the deadline
        (an engine trickling bytes is cut off); raises _Cut past it."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Cut
        if wait is None:
            return None if math.isinf(left) else left
        return min(wait, left)

    def check_cut(self) -> None:
        """Raise _Cut if the timer shut the socket down."""
        if self.cut.is_set():
            raise _Cut

    def _cut_off(self) -> None:
        # Per-read timeouts cannot bound headers trickled a byte at a time: at the
        # deadline the socket is shut down, which ends any read in progress.
        self.cut.set()
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def send(self, conn: http.client.HTTPConnection) -> None:
        """Connect ``conn`` (unless it is alive), start the deadline's timer, send."""
        self.conn = conn
        timeouts = self.request.timeouts
        if conn.sock is None:
            conn.timeout = self.bounded(timeouts.connect_s)
            conn.connect()
        if math.isfinite(self.total):
            self._timer = threading.Timer(self.total, self._cut_off)
            self._timer.daemon = True
            self._timer.start()
        self.phase = "send"
        conn.sock.settimeout(self.bounded(timeouts.read_s))
        conn.request(
            "POST",
            self.request.path,
            body=self.request.body,
            headers={"Content-Type": "application/json", "Accept": "application/msgpack"},
        )
        self.phase = "headers"

    def body_length(self, resp: http.client.HTTPResponse) -> int:
        """The body's length of a 2xx answer with a Content-Length within the request's
        limit; the typed error otherwise (a non-2xx answer with an excerpt of its body)."""
        request = self.request
        ctx = {"url": request.url, "request_id": request.request_id}
        if not 200 <= resp.status < 300:
            excerpt = resp.read(EXCERPT_BYTES).decode("utf-8", "replace")
            raise EngineStatusError(
                f"engine answered HTTP {resp.status} {resp.reason or ''} to POST"
                f" {request.path}: {excerpt!r}",
                status=resp.status,
                body_excerpt=excerpt,
                **ctx,
            )
        length_header = resp.getheader("Content-Length")
        if length_header is None or not length_header.isdigit():
            raise EngineProtocolError(
                f"answer to POST {request.path} has no Content-Length (got"
                f" {length_header!r}): fetch_in_parser reads bodies of known size",
                **ctx,
            )
        length = int(length_header)
        self.attempt.progress.expected = length
        if length > request.max_body_bytes:
            raise BodyTooLargeError(
                f"body of {length} bytes (Content-Length) is over max_body_bytes="
                f"{request.max_body_bytes}: refused unread",
                **ctx,
            )
        return length

    def read_body(
        self, sock: socket.socket, resp: http.client.HTTPResponse, view: memoryview
    ) -> None:
        """Fill ``view`` with the body, a chunk at a time, each read on ``sock`` bounded."""
        length, chunk = len(view), self.request.chunk_bytes
        read_s = self.request.timeouts.read_s
        got = 0
        while got < length:
            sock.settimeout(self.bounded(read_s))
            n = resp.readinto(view[got : got + min(length - got, chunk)])
            if not n:
                break
            got += n
            self.attempt.progress.received = got
        if got < length:
            self.check_cut()
            raise engine_error(Failure.TRUNCATED, self.attempt, "the body ended early")


def _classify(exc: BaseException, phase: str, cut: bool) -> Failure:
    """What an ``http.client``/socket failure means, from the phase it happened in."""
    if cut:
        return Failure.TOTAL_TIMEOUT
    timed_out = isinstance(exc, TimeoutError)
    if phase == "connect":
        return Failure.CONNECT_TIMEOUT if timed_out else Failure.UNREACHABLE
    if phase == "send":
        # The request could not be written whole: the engine never got it.
        return Failure.NOT_SENT
    if timed_out:
        return Failure.READ_TIMEOUT
    if isinstance(exc, http.client.IncompleteRead):
        return Failure.TRUNCATED
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionError):
        return Failure.DROPPED
    if isinstance(exc, http.client.HTTPException):
        return Failure.MALFORMED
    return Failure.DROPPED


def _has_pending(sock: socket.socket) -> bool:
    """Whether the peer sent something (bytes or a close) before we asked anything."""
    timeout = sock.gettimeout()
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK) is not None
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)
