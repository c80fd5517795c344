"""The HTTP client of the inference engines: bounded, typed errors, retries, bodies into caller memory.

Bodies are read chunk by chunk into a buffer given by a :class:`BodyAllocator`, never joined
on the event loop (aiohttp's ``read()`` of a 512 MB body stalls the loop for 0.3-0.4 s).
Bytes go through an :class:`~miles_lite.engine.http.transport.AsyncTransport` (aiohttp by
default; :class:`~miles_lite.engine.http.mock.MockTransport` in unit tests), whose
failures are translated in one place (:mod:`miles_lite.engine.http._errors`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio
import anyio.to_thread

from miles_lite._core import json as _json
from miles_lite._core.resources import AsyncResource
from miles_lite._core.validate import check_seconds
from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.http._body import read_all_chunks, read_excerpt, writable_bytes
from miles_lite.engine.http._errors import (
    Attempt,
    Failure,
    Progress,
    Timeouts,
    engine_error,
    status_error,
)
from miles_lite.engine.http._retry import retry_call
from miles_lite.engine.http._routing import route_headers
from miles_lite.engine.http.aiohttp_transport import AiohttpTransport
from miles_lite.engine.http.response import BodyAllocator, RawResponse, allocate_fresh
from miles_lite.engine.http.transport import AsyncTransport, Request, ResponseStream
from miles_lite.errors import BodyTooLargeError, EngineError, EngineProtocolError

__all__ = ["EngineClient", "EngineClientStatistics"]

#: Bodies without Content-Length up to this size are copied on the loop, larger in a thread.
_INLINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class EngineClientStatistics:
    """Counters of an :class:`EngineClient` since it was made (a snapshot).

    ``requests``: calls made (post, get_json, post_json, health); ``attempts``: HTTP
    exchanges started (requests + retries); ``retries``: attempts after the first;
    ``failures``: calls that ended with an error; ``bytes_received``: body bytes read, failed
    attempts included.
    """

    requests: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    bytes_received: int = 0


class EngineClient(AsyncResource):
    """Talks HTTP to SGLang engines through one transport with bounded resources.

    An async resource: ``async with EngineClient(config) as client`` opens it (the
    aiohttp session is made inside the running loop); after :meth:`aclose` (or outside
    the block) every call raises :class:`~miles_lite.errors.ClosedResourceError`. Use one
    client within one event loop; any number of tasks may share it; connections are
    pooled (``max_connections``, ``max_connections_per_host``), and control calls
    (``control=True``, :meth:`health`, :meth:`delete_json`) have a pool of their own
    (``control_connections_per_host``). ``transport`` replaces the
    aiohttp one (a :class:`~miles_lite.engine.http.mock.MockTransport` in unit tests).

    Errors are typed and carry the engine ``url`` and the ``request_id``:
    ``EngineUnavailableError`` (refused, reset, disconnected), ``EngineTimeoutError``,
    ``EngineStatusError`` (non-2xx), ``EngineProtocolError`` (truncated or malformed answer),
    ``BodyTooLargeError``. Retryable ones are retried under ``config.retry`` unless the
    call says ``retry=False`` (the router's own retry loop then picks another engine).
    Cancellation propagates at once and closes the connection of the attempt in progress.

    Usage::

        async with EngineClient(EngineClientConfig()) as client:
            raw = await client.post(url, "/rollout/generate", payload, request_id=rid)
    """

    _resource_name = "engine client"

    def __init__(
        self, config: EngineClientConfig | None = None, *, transport: AsyncTransport | None = None
    ) -> None:
        super().__init__()
        self._config = config if config is not None else EngineClientConfig()
        self._transport: AsyncTransport = (
            transport if transport is not None else AiohttpTransport(self._config)
        )
        # The jitter needs no reproducibility; a private generator keeps callers' seeds intact.
        self._random = random.Random()
        self._timeouts = self._bounds(self._config.total_timeout_s)
        self._requests = 0
        self._attempts = 0
        self._retries = 0
        self._failures = 0
        self._bytes_received = 0

    @property
    def config(self) -> EngineClientConfig:
        """The settings this client was made with."""
        return self._config

    def statistics(self) -> EngineClientStatistics:
        """A snapshot of the request, retry and byte counters."""
        return EngineClientStatistics(
            requests=self._requests,
            attempts=self._attempts,
            retries=self._retries,
            failures=self._failures,
            bytes_received=self._bytes_received,
        )

    async def _close(self) -> None:
        # Requests still running fail with EngineUnavailableError or, between attempts,
        # ClosedResourceError.
        await self._transport.aclose()

    def post(
        self,
        url: str,
        path: str,
        payload: dict[str, Any],
        *,
        request_id: str | None = None,
        into: BodyAllocator | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        control: bool = False,
    ) -> Coroutine[Any, Any, RawResponse]:
        """POST ``payload`` as JSON to ``url + path`` and return the 2xx answer unparsed.

        ``url`` is the engine's base URL (``http://host:port``), ``path`` the endpoint
        (``/rollout/generate``). The body is written into a buffer from ``into(nbytes)``
        (default: :func:`allocate_fresh`): with a Content-Length, one buffer of that size is
        asked for before reading; without one, chunks are gathered up to ``max_body_bytes``
        and copied into a buffer of the final size off the loop.

        ``timeout_s`` replaces the total timeout for this call (seconds): control calls
        (abort, loads, health, weight updates) and agent turns bounded by their own
        setting; generations otherwise leave it unset, so that the client config
        (``total_timeout_s``, ``read_timeout_s``, ``max_body_bytes``) is the one owner of
        their limits.

        Retryable failures (the request never reached the engine, or 502/503/504) are
        retried under ``config.retry`` on this engine; ``retry=False`` makes one attempt
        (:meth:`Router.call` retries on another engine instead).

        ``control=True`` sends a control call (a flush, a pause, a weight load, an abort)
        on connections of its own (``control_connections_per_host``): it never waits for
        a connection generations hold (a ``retract`` or ``in_place`` pause keeps them
        open until its update is done).

        ``headers`` are sent with this request only (over the config's ``headers``).
        ``on_chunk`` is given each piece of the body as it arrives (a streamed answer:
        read in pieces even with a Content-Length); the body is still returned whole.
        Inside ``Router.call(fn, key=...)`` through SGLang's router, the sticky key's
        header is added to requests to the router (:mod:`miles_lite.engine.smg`).

        Raises ``EngineStatusError`` (non-2xx; ``status``, ``body_excerpt``),
        ``EngineUnavailableError``, ``EngineTimeoutError``, ``EngineProtocolError``
        (truncated body, unsupported Content-Encoding), ``BodyTooLargeError`` (over
        ``max_body_bytes``, refused before reading when Content-Length says so),
        ``ClosedResourceError``, ``ConfigError`` (invalid URL), ``TypeError``/``ValueError``
        (payload not JSON-serializable), and whatever ``into`` raises, unchanged. On
        cancellation the connection is closed and nothing is returned.
        """
        # Not a coroutine itself: it encodes the body and hands back the call's coroutine
        # (await it), one coroutine level less for every answer to wake.
        data = _json.dumps(payload)
        return self._call(
            "POST", url, path, data, request_id, into, timeout_s, retry, headers, on_chunk, control
        )

    async def get_json(
        self,
        url: str,
        path: str,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        control: bool = False,
    ) -> Any:
        """GET ``url + path`` and return the answer parsed as JSON (``None`` if empty).

        For control endpoints (``/model_info``, ``/v1/loads``). Retried and given
        ``headers`` like :meth:`post`. ``control``: a control call, on connections of
        its own (``control_connections_per_host``), never queued behind generations.
        Raises the errors of :meth:`post`, and ``EngineProtocolError`` when the body is
        not JSON. Cancellation propagates.
        """
        raw = await self._call(
            "GET", url, path, None, request_id, None, timeout_s, retry, headers, control=control
        )
        return _parse_json(raw, "GET", path)

    async def post_json(
        self,
        url: str,
        path: str,
        payload: Any = None,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        control: bool = False,
    ) -> Any:
        """POST ``payload`` as JSON (no body if ``None``) and return the answer parsed as JSON.

        For ``/generate`` and control endpoints (``/abort_request``,
        ``/pause_generation``: ``control=True``, as :meth:`get_json`); an empty answer
        gives ``None``. Retried and given ``headers`` like :meth:`post` (``retry=False``:
        one attempt). Raises the errors of :meth:`post`, and ``EngineProtocolError`` when
        the body is not JSON. Cancellation propagates.
        """
        data = None if payload is None else _json.dumps(payload)
        raw = await self._call(
            "POST", url, path, data, request_id, None, timeout_s, retry, headers, control=control
        )
        return _parse_json(raw, "POST", path)

    async def delete_json(self, url: str, path: str, *, timeout_s: float | None = None) -> Any:
        """DELETE ``url + path`` (one attempt, a control call) and return the answer parsed
        as JSON (for smg's ``/workers/{id}``); raises as :meth:`post_json`."""
        raw = await self._call(
            "DELETE", url, path, None, None, None, timeout_s, False, None, control=True
        )
        return _parse_json(raw, "DELETE", path)

    async def health(
        self, url: str, *, path: str = "/health", timeout_s: float | None = None
    ) -> bool:
        """Whether ``GET url + path`` answers 2xx, in one attempt (no retries).

        Any :class:`~miles_lite.errors.EngineError` (refused, timeout, 503 while starting)
        gives ``False``. ``timeout_s`` bounds the probe (seconds; default: the client's total
        timeout). Raises ``ClosedResourceError`` when the client is not open and
        ``ConfigError`` for an invalid URL. Cancellation propagates.
        """
        try:
            await self._call("GET", url, path, None, None, None, timeout_s, False, control=True)
        except EngineError:
            return False
        return True

    # -- internals -------------------------------------------------------------------------

    def _bounds(self, total_s: float | None) -> Timeouts:
        config = self._config
        return Timeouts(
            connect_s=config.connect_timeout_s, read_s=config.read_timeout_s, total_s=total_s
        )

    async def _call(
        self,
        method: str,
        url: str,
        path: str,
        data: bytes | None,
        request_id: str | None,
        into: BodyAllocator | None,
        timeout_s: float | None,
        retry: bool,
        headers: Mapping[str, str] | None = None,
        on_chunk: Callable[[bytes], None] | None = None,
        control: bool = False,
    ) -> RawResponse:
        self._check_open(url=url, request_id=request_id)
        if timeout_s is None:
            timeouts = self._timeouts
        else:
            check_seconds("EngineClient", "timeout_s", timeout_s)
            timeouts = self._bounds(timeout_s)
        allocator: BodyAllocator = into if into is not None else allocate_fresh
        routed = route_headers(url)
        if routed is not None:
            headers = {**headers, **routed} if headers else routed
        where = Attempt(method, url, path, request_id, timeouts, Progress())
        request = Request(where, data, dict(headers) if headers else None, control)
        self._requests += 1
        try:
            if not retry:
                return await self._exchange(request, allocator, on_chunk)
            # A partial, not a closure: a nested function would make this call allocate a
            # cell per variable it reads on every request, retried or not (GC-tracked
            # objects that live as long as the request).
            attempt = partial(self._attempt, request, allocator, on_chunk)
            return await retry_call(
                self._config.retry, attempt, rand=self._random.random, on_retry=self._on_retry
            )
        except Exception:
            self._failures += 1
            raise

    async def _attempt(
        self,
        request: Request,
        into: BodyAllocator,
        on_chunk: Callable[[bytes], None] | None,
    ) -> RawResponse:
        """One attempt of ``request``, a call its client retries (see :meth:`_call`): its
        own progress, so an error names what this attempt received."""
        where = request.attempt
        self._check_open(url=where.url, request_id=where.request_id)  # closed while backing off
        fresh = replace(request, attempt=replace(where, progress=Progress()))
        return await self._exchange(fresh, into, on_chunk)

    def _on_retry(self, retry: int, error: Exception, delay_s: float) -> None:
        self._retries += 1

    async def _exchange(
        self,
        request: Request,
        into: BodyAllocator,
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> RawResponse:
        """One HTTP attempt: send, check the status, read the body into a buffer."""
        self._attempts += 1
        where = request.attempt
        stream = await self._transport.send(request)
        complete = False
        try:
            if not 200 <= stream.status < 300:
                excerpt = await read_excerpt(stream, where.progress)
                raise status_error(where, stream.status, stream.reason, stream.headers, excerpt)
            encoding = stream.headers.get("Content-Encoding")
            if encoding is not None and encoding.strip().lower() not in ("", "identity"):
                raise EngineProtocolError(
                    f"answer to {where.method} {where.path} has Content-Encoding"
                    f" {encoding.strip().lower()!r} although identity was asked for; turn"
                    " compression off on the engine's proxy",
                    url=where.url,
                    request_id=where.request_id,
                )
            owner, body = await self._read_body(stream, where, into, on_chunk)
            complete = True
            return RawResponse(
                url=where.url,
                status=stream.status,
                content_type=stream.content_type,
                headers=stream.headers,
                body=body,
                owner=owner,
                request_id=where.request_id,
            )
        finally:
            self._bytes_received += where.progress.received
            # release() keeps a fully read connection for reuse; close() drops a half-read one.
            if complete:
                stream.release()
            else:
                stream.close()

    async def _read_body(
        self,
        stream: ResponseStream,
        where: Attempt,
        into: BodyAllocator,
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> tuple[object, memoryview]:
        config = self._config
        limit = config.max_body_bytes
        chunk_bytes = config.read_chunk_bytes
        progress = where.progress
        url, request_id = where.url, where.request_id
        length = stream.content_length
        if length is not None and on_chunk is None:
            if length > limit:
                raise BodyTooLargeError(
                    f"body of {length} bytes (Content-Length) is over max_body_bytes={limit}:"
                    " refused unread; raise the limit or ask for fewer outputs per request",
                    url=url,
                    request_id=request_id,
                )
            progress.expected = length
            if length == 0:
                return None, memoryview(b"")
            owner = await into(length)
            view = writable_bytes(owner, length, url=url, request_id=request_id)
            await stream.read_into(view)
            if progress.received < length:
                raise engine_error(Failure.TRUNCATED, where, "the body ended early")
            return owner, view

        chunks = await read_all_chunks(
            stream, chunk_bytes, limit, progress, url=url, request_id=request_id, on_chunk=on_chunk
        )
        total = progress.received
        if total == 0:
            return None, memoryview(b"")
        owner = await into(total)
        view = writable_bytes(owner, total, url=url, request_id=request_id)
        if total <= _INLINE_BYTES:
            _copy_chunks(chunks, view)
        else:
            # Not abandoned on cancellation: the copy is bounded and must not outlive `view`.
            await anyio.to_thread.run_sync(_copy_chunks, chunks, view)
        return owner, view


def _copy_chunks(chunks: list[bytes], view: memoryview) -> None:
    pos = 0
    for chunk in chunks:
        end = pos + len(chunk)
        view[pos:end] = chunk
        pos = end


def _parse_json(raw: RawResponse, method: str, path: str) -> Any:
    if raw.nbytes == 0:
        return None
    try:
        # On the loop: json.loads holds the GIL throughout, so a thread would not free the
        # loop; control answers are a few KiB (a /generate answer with log-probs, ~1 MB).
        return _json.loads(raw.body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise EngineProtocolError(
            f"answer to {method} {path} is not JSON ({raw.content_type}): {exc}",
            url=raw.url,
            request_id=raw.request_id,
        ) from exc
