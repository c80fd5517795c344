"""What runs inside a parser worker: decode bodies in the arena, or fetch them straight into it.

These functions are imported by worker processes and must stay light: no torch import
(tensor views are made in the main process from the page numbers returned here), so a
parser worker starts in tens of milliseconds.

A worker's arena attachment and its HTTP connections live in ``_STATE``, this worker
process's own state, set by :func:`init_parser_worker` when the process starts.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from miles_lite.codecs.body import decode_body, wire_form
from miles_lite.errors import (
    ArenaFullError,
    BodyTooLargeError,
    CodecError,
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
)
from miles_lite.pools.arena_pages import Allocation, ArenaHandle
from miles_lite.pools.worker_arena import WorkerArena

__all__ = ["FetchRequest", "ParseResult", "fetch_and_parse", "init_parser_worker", "parse_in_arena"]

_EXCERPT = 500


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A POST a worker makes itself (``fetch_in_parser``); sizes in bytes, times in seconds.

    ``timeout_s`` bounds the whole exchange (connect, send, headers, body: the client's
    ``total_timeout_s``; 0 or None: no total bound, as the client's None);
    ``read_timeout_s`` bounds each socket read (None: the total).
    ``expected_items``, when set, is the number of samples the answer must hold: an
    answer with another count is refused (it cannot be this request's). The worker never
    retries: the caller decides, from the typed error. Only ``http://`` URLs: an
    ``https://`` one is refused here with :class:`ConfigError` (the worker speaks plain
    HTTP; use the engine client's transport for TLS).
    """

    url: str
    path: str
    payload: dict[str, Any]
    request_id: str | None
    timeout_s: float | None
    max_body_bytes: int
    read_timeout_s: float | None = None
    expected_items: int | None = None
    align: bool = True
    alloc_wait_s: float = 2.0

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme != "http":
            raise ConfigError(
                f"FetchRequest.url must be an http:// URL (fetch_in_parser speaks plain "
                f"HTTP), got {self.url!r}"
            )
        if self.timeout_s is not None and not (
            self.timeout_s >= 0 and math.isfinite(self.timeout_s)
        ):
            raise ConfigError(f"FetchRequest.timeout_s must be >= 0 or None, got {self.timeout_s}")
        if self.read_timeout_s is not None and not self.read_timeout_s > 0:
            raise ConfigError(
                f"FetchRequest.read_timeout_s must be > 0 or None, got {self.read_timeout_s}"
            )


@dataclass(slots=True)
class ParseResult:
    """A decoded body: ``items`` hold :class:`TensorRef` s relative to the allocation start.

    ``allocation`` is set when the worker allocated the bytes (the main process adopts
    it); ``used_bytes`` is how much of it the tensors need. Times are ``time.monotonic``
    readings (one clock for all processes on Linux); ``wire_bytes`` is the body size.
    """

    items: list[Any]
    used_bytes: int
    allocation: Allocation | None = None
    #: The arena was full: the body was read into private memory and comes back pickled.
    spilled: bool = False
    wire_bytes: int = 0
    content_type: str = ""
    response_at: float = 0.0
    read_at: float = 0.0
    parsed_at: float = 0.0
    payload: bytes | bytearray | None = field(default=None, repr=False)


class _WorkerState:
    def __init__(self, arena: WorkerArena | None) -> None:
        self.arena = arena
        self.connections: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def connection(
        self, host: str, port: int, timeout_s: float | None
    ) -> http.client.HTTPConnection:
        conn = self.connections.get((host, port))
        if conn is not None and conn.sock is not None and _has_pending(conn.sock):
            # Bytes (or EOF) nobody asked for: never read them as the next answer.
            self.drop(host, port)
            conn = None
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            self.connections[(host, port)] = conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def drop(self, host: str, port: int) -> None:
        conn = self.connections.pop((host, port), None)
        if conn is not None:
            conn.close()


_STATE: _WorkerState | None = None


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


def init_parser_worker(index: int, tag: int, handle: ArenaHandle | None) -> None:
    """Attach this worker to the arena (``handle`` None: no shared memory)."""
    global _STATE
    _STATE = _WorkerState(WorkerArena(handle, tag) if handle is not None else None)


def _state() -> _WorkerState:
    if _STATE is None:
        raise RuntimeError("parser worker used before init_parser_worker ran")
    return _STATE


def parse_in_arena(
    allocation: Allocation, nbytes: int, content_type: str, align: bool
) -> ParseResult:
    """Decode a body the main process wrote into ``allocation`` (its first ``nbytes``)."""
    arena = _state().arena
    if arena is None:
        raise RuntimeError("parse_in_arena needs an arena")
    view = arena.view(allocation, nbytes)
    result = _decode_in(view, content_type, align)
    result.wire_bytes = nbytes
    return result


def parse_bytes(body: bytes, content_type: str) -> ParseResult:
    """Decode a body sent through the pipe (no arena: remote executors); slow for big bodies."""
    decoded = decode_body(memoryview(body), content_type)
    if decoded.in_place:
        return ParseResult(decoded.items, len(body), payload=body, wire_bytes=len(body))
    out = bytearray(decoded.nbytes)
    decoded.fill(memoryview(out))
    return ParseResult(decoded.items, decoded.nbytes, payload=bytes(out), wire_bytes=len(body))


def _decode_in(view: memoryview, content_type: str, align: bool) -> ParseResult:
    decoded = decode_body(view, content_type, align=align)
    if not decoded.in_place:
        # base64/JSON: every byte was copied out by json.loads, so the decoded tensors can
        # overwrite the body; they always fit (each base64 map is larger than its padding).
        if decoded.nbytes > len(view):
            raise CodecError(
                f"decoded tensors ({decoded.nbytes} bytes) exceed the body ({len(view)} bytes)"
            )
        decoded.fill(view)
    return ParseResult(decoded.items, decoded.nbytes, parsed_at=time.monotonic())


def fetch_and_parse(request: FetchRequest) -> ParseResult:
    """POST ``request`` to its engine, read the answer into the arena and decode it there.

    The body never passes through the main process. Raises the engine errors of
    :mod:`miles_lite.errors` with url and request id; frees its allocation on error.
    """
    state = _state()
    arena = state.arena
    if arena is None:
        raise RuntimeError("fetch_and_parse needs an arena")
    split = urlsplit(request.url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    where = {"url": request.url, "request_id": request.request_id}
    body = json.dumps(request.payload).encode()
    allocation: Allocation | None = None
    total = request.timeout_s or math.inf
    deadline = time.monotonic() + total
    read_timeout: float | None = request.read_timeout_s or request.timeout_s or None

    def bounded() -> float | None:
        # Each socket operation waits at most the read timeout and never past the
        # deadline of the whole exchange (an engine trickling bytes is cut off).
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if read_timeout is None:
            return None if math.isinf(left) else left
        return min(read_timeout, left)

    cut = threading.Event()

    def cut_off() -> None:
        # Per-read timeouts cannot bound headers trickled a byte at a time: at the
        # deadline the socket is shut down, which ends any read in progress.
        cut.set()
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    conn: http.client.HTTPConnection | None = None
    timer = threading.Timer(total, cut_off)
    timer.daemon = True
    try:
        try:
            conn = state.connection(host, port, bounded())
            if conn.sock is None:
                conn.connect()
            if math.isfinite(total):
                timer.start()
            conn.request(
                "POST",
                request.path,
                body=body,
                headers={"Content-Type": "application/json", "Accept": "application/msgpack"},
            )
            resp = conn.getresponse()
            if cut.is_set():
                raise TimeoutError  # headers cut short at the deadline
            response_at = time.monotonic()
            content_type = resp.getheader("Content-Type", "")
            if not 200 <= resp.status < 300:
                excerpt = resp.read(_EXCERPT).decode("utf-8", "replace")
                state.drop(host, port)
                raise EngineStatusError(
                    f"engine answered {resp.status} to POST {request.path}: {excerpt}",
                    status=resp.status,
                    body_excerpt=excerpt,
                    **where,
                )
            length_header = resp.getheader("Content-Length")
            if length_header is None:
                state.drop(host, port)
                raise EngineProtocolError("answer has no Content-Length", **where)
            length = int(length_header)
            if length > request.max_body_bytes:
                state.drop(host, port)
                raise BodyTooLargeError(
                    f"body of {length} bytes exceeds max_body_bytes={request.max_body_bytes}",
                    **where,
                )
            wire_form(content_type)
            spill: bytearray | None = None
            try:
                allocation = arena.alloc(length, timeout_s=request.alloc_wait_s)
                view = arena.view(allocation, length)
            except ArenaFullError:
                spill = bytearray(length)
                view = memoryview(spill)
            got = 0
            while got < length:
                if conn.sock is not None:
                    conn.sock.settimeout(bounded())
                n = resp.readinto(view[got : got + min(length - got, 1 << 20)])
                if not n:
                    break
                got += n
            if got < length:
                state.drop(host, port)
                if cut.is_set():
                    raise TimeoutError
                raise EngineProtocolError(f"truncated body: got {got} of {length} bytes", **where)
            read_at = time.monotonic()
            if conn.sock is None or _has_pending(conn.sock):
                # Bytes past Content-Length (or a close): this connection's next answer
                # could be anything; never reuse it.
                state.drop(host, port)
        except (TimeoutError, http.client.HTTPException, OSError) as exc:
            state.drop(host, port)
            if isinstance(exc, TimeoutError) or cut.is_set():
                raise EngineTimeoutError(
                    f"no complete answer within {request.timeout_s} s (read timeout "
                    f"{read_timeout} s)",
                    **where,
                ) from exc
            if isinstance(exc, http.client.IncompleteRead):
                raise EngineProtocolError(
                    f"truncated body: got {len(exc.partial)} more bytes, {exc.expected} missing",
                    **where,
                ) from exc
            raise EngineUnavailableError(f"connection failed: {exc!r}", **where) from exc
        finally:
            timer.cancel()
        result = _decode_in(view, content_type, request.align)
        if request.expected_items is not None and len(result.items) != request.expected_items:
            state.drop(host, port)
            raise EngineProtocolError(
                f"answer holds {len(result.items)} samples, the request asked for "
                f"{request.expected_items}: not this request's answer",
                **where,
            )
        if spill is not None:
            result.payload = spill if result.used_bytes == length else spill[: result.used_bytes]
            result.spilled = True
    except MilesLiteError as exc:
        # Whatever failed (an unexpected content type, a bad body), the answer may not
        # have been read to its end: the connection is never reused.
        state.drop(host, port)
        if allocation is not None:
            arena.free(allocation)
        exc.with_context(**where)
        raise
    except BaseException:
        state.drop(host, port)
        if allocation is not None:
            arena.free(allocation)
        raise
    result.allocation = allocation
    result.wire_bytes = length
    result.content_type = content_type
    result.response_at = response_at
    result.read_at = read_at
    return result
