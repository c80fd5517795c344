"""The HTTP client of the inference engines: one aiohttp session, bounded, typed errors, retries.

Bodies are read chunk by chunk into a buffer given by a :class:`BodyAllocator`, never joined
on the event loop (aiohttp's ``read()`` of a 512 MB body stalls the loop for 0.3-0.4 s).
aiohttp's exceptions become miles_lite's in exactly one place, ``_aiohttp_errors.translated``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import anyio
import anyio.to_thread

from miles_lite._core import json as _json
from miles_lite.engine._body import fill_view, read_all_chunks, read_excerpt, writable_bytes
from miles_lite.engine._errors import Attempt, Progress, translated, truncated_message
from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.response import BodyAllocator, RawResponse, allocate_fresh
from miles_lite.engine.retry import RetryPolicy, retry_call
from miles_lite.errors import (
    BodyTooLargeError,
    ClosedResourceError,
    ConfigError,
    EngineError,
    EngineProtocolError,
    EngineStatusError,
)

__all__ = ["EngineClient", "EngineClientStats"]

#: Longest time aclose() waits for the session's connections to close, in seconds.
_CLOSE_TIMEOUT_S = 5.0
#: Bodies without Content-Length up to this size are copied on the loop, larger in a thread.
_INLINE_BYTES = 1 << 20
_NO_RETRY = RetryPolicy(max_attempts=1)
# identity: Content-Length must be the body's size, and compressed bodies would need a
# decompression pass on the loop.
_GET_HEADERS = {"Accept-Encoding": "identity"}
_JSON_HEADERS = {"Accept-Encoding": "identity", "Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class EngineClientStats:
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


class EngineClient:
    """Talks HTTP to SGLang engines through one aiohttp session with bounded resources.

    An async context manager; :meth:`aclose` closes it, after which every call raises
    :class:`~miles_lite.errors.ClosedResourceError`. The session is made on first use (or on
    entering), inside the running event loop; use one client within one event loop. Any
    number of tasks may share it; connections are pooled (``max_connections``,
    ``max_connections_per_host``).

    Errors are typed and carry the engine ``url`` and the ``request_id``:
    ``EngineUnavailableError`` (refused, reset, disconnected), ``EngineTimeoutError``,
    ``EngineStatusError`` (non-2xx), ``EngineProtocolError`` (truncated or malformed answer),
    ``BodyTooLargeError``. Retryable ones are retried under ``config.retry``.
    Cancellation propagates at once and closes the connection of the attempt in progress.

    Usage::

        async with EngineClient(EngineClientConfig()) as client:
            raw = await client.post(url, "/rollout/generate", payload, request_id=rid)
    """

    def __init__(self, config: EngineClientConfig | None = None) -> None:
        self._config = config if config is not None else EngineClientConfig()
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # The jitter needs no reproducibility; a private generator keeps callers' seeds intact.
        self._random = random.Random()
        self._timeout = self._client_timeout(self._config.total_timeout_s)
        self._requests = 0
        self._attempts = 0
        self._retries = 0
        self._failures = 0
        self._bytes_received = 0

    @property
    def config(self) -> EngineClientConfig:
        """The settings this client was made with."""
        return self._config

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    @property
    def stats(self) -> EngineClientStats:
        """A snapshot of the request, retry and byte counters."""
        return EngineClientStats(
            requests=self._requests,
            attempts=self._attempts,
            retries=self._retries,
            failures=self._failures,
            bytes_received=self._bytes_received,
        )

    async def __aenter__(self) -> EngineClient:
        self._session_or_raise(None, None)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session and its connections. Idempotent.

        Shielded from cancellation and bounded to 5 s, so it completes even in a cancelled
        scope. Requests still running fail with ``EngineUnavailableError`` or, if they were
        between attempts, ``ClosedResourceError``.
        """
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                await session.close()

    async def post(
        self,
        url: str,
        path: str,
        payload: dict[str, Any],
        *,
        request_id: str | None = None,
        into: BodyAllocator | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> RawResponse:
        """POST ``payload`` as JSON to ``url + path`` and return the 2xx answer unparsed.

        ``url`` is the engine's base URL (``http://host:port``), ``path`` the endpoint
        (``/rollout/generate``). The body is written into a buffer from ``into(nbytes)``
        (default: :func:`allocate_fresh`): with a Content-Length, one buffer of that size is
        asked for before reading; without one, chunks are gathered up to ``max_body_bytes``
        and copied into a buffer of the final size off the loop.

        ``timeout_s`` is for control endpoints only (abort, loads, health, weight
        updates): it replaces the total timeout for this call (seconds). Generations leave
        it unset, so that the client config (``total_timeout_s``, ``read_timeout_s``,
        ``max_body_bytes``) is the one owner of their limits.

        Retryable failures (the request never reached the engine, or 502/503/504) are
        retried under ``config.retry`` on this engine; ``retry=False`` makes one attempt
        (:meth:`Router.call` retries on another engine instead).

        Raises ``EngineStatusError`` (non-2xx; ``status``, ``body_excerpt``),
        ``EngineUnavailableError``, ``EngineTimeoutError``, ``EngineProtocolError``
        (truncated body, unsupported Content-Encoding), ``BodyTooLargeError`` (over
        ``max_body_bytes``, refused before reading when Content-Length says so),
        ``ClosedResourceError``, ``ConfigError`` (invalid URL), ``TypeError``/``ValueError``
        (payload not JSON-serializable), and whatever ``into`` raises, unchanged. On
        cancellation the connection is closed and nothing is returned.
        """
        data = _json.dumps(payload)
        policy = self._config.retry if retry else _NO_RETRY
        return await self._call("POST", url, path, data, request_id, into, timeout_s, policy)

    async def get_json(
        self,
        url: str,
        path: str,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Any:
        """GET ``url + path`` and return the answer parsed as JSON (``None`` if empty).

        For control endpoints (``/model_info``, ``/server_info``). Retried like :meth:`post`.
        Raises the errors of :meth:`post`, and ``EngineProtocolError`` when the body is not
        JSON. Cancellation propagates.
        """
        raw = await self._call(
            "GET", url, path, None, request_id, None, timeout_s, self._policy(retry)
        )
        return await _parse_json(raw, "GET", path)

    async def post_json(
        self,
        url: str,
        path: str,
        payload: Any = None,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
        retry: bool = True,
    ) -> Any:
        """POST ``payload`` as JSON (no body if ``None``) and return the answer parsed as JSON.

        For control endpoints (``/abort_request``, ``/pause_generation``,
        ``/update_weight_version``); an empty answer gives ``None``. Retried like
        :meth:`post` (``retry=False``: one attempt). Raises the errors of :meth:`post`, and
        ``EngineProtocolError`` when the body is not JSON. Cancellation propagates.
        """
        data = None if payload is None else _json.dumps(payload)
        policy = self._config.retry if retry else _NO_RETRY
        raw = await self._call("POST", url, path, data, request_id, None, timeout_s, policy)
        return await _parse_json(raw, "POST", path)

    async def health(
        self, url: str, *, path: str = "/health", timeout_s: float | None = None
    ) -> bool:
        """Whether ``GET url + path`` answers 2xx, in one attempt (no retries).

        Any :class:`~miles_lite.errors.EngineError` (refused, timeout, 503 while starting)
        gives ``False``. ``timeout_s`` bounds the probe (seconds; default: the client's total
        timeout). Raises ``ClosedResourceError`` after :meth:`aclose` and ``ConfigError`` for
        an invalid URL. Cancellation propagates.
        """
        try:
            await self._call("GET", url, path, None, None, None, timeout_s, _NO_RETRY)
        except EngineError:
            return False
        return True

    # -- internals -------------------------------------------------------------------------

    def _policy(self, retry: bool) -> RetryPolicy:
        # retry=False: the caller retries (Router.call leases another engine per attempt).
        return self._config.retry if retry else _NO_RETRY

    def _client_timeout(self, total_s: float | None) -> aiohttp.ClientTimeout:
        # sock_connect, not connect: aiohttp's `connect` also counts the wait for a free
        # pooled connection, which under load is queueing, not an engine failure.
        return aiohttp.ClientTimeout(
            total=total_s,
            sock_connect=self._config.connect_timeout_s,
            sock_read=self._config.read_timeout_s,
        )

    def _session_or_raise(self, url: str | None, request_id: str | None) -> aiohttp.ClientSession:
        if self._closed:
            raise ClosedResourceError(
                "engine client is closed (aclose() was called): make a new EngineClient",
                url=url,
                request_id=request_id,
            )
        if self._session is None:
            config = self._config
            connector = aiohttp.TCPConnector(
                limit=config.max_connections, limit_per_host=config.max_connections_per_host
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                read_bufsize=config.read_chunk_bytes,
                raise_for_status=False,
                trust_env=False,
                headers=dict(config.headers),
            )
        return self._session

    async def _call(
        self,
        method: str,
        url: str,
        path: str,
        data: bytes | None,
        request_id: str | None,
        into: BodyAllocator | None,
        timeout_s: float | None,
        policy: RetryPolicy,
    ) -> RawResponse:
        self._session_or_raise(url, request_id)
        timeout = self._timeout if timeout_s is None else self._override_timeout(timeout_s)
        allocator: BodyAllocator = into if into is not None else allocate_fresh
        self._requests += 1

        async def attempt() -> RawResponse:
            return await self._exchange(method, url, path, data, request_id, allocator, timeout)

        try:
            return await retry_call(
                policy, attempt, rand=self._random.random, on_retry=self._on_retry
            )
        except Exception:
            self._failures += 1
            raise

    def _on_retry(self, retry: int, error: Exception, delay_s: float) -> None:
        self._retries += 1

    def _override_timeout(self, timeout_s: float) -> aiohttp.ClientTimeout:
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not (math.isfinite(timeout_s) and timeout_s > 0)
        ):
            raise ConfigError(
                f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}"
            )
        return self._client_timeout(timeout_s)

    async def _exchange(
        self,
        method: str,
        url: str,
        path: str,
        data: bytes | None,
        request_id: str | None,
        into: BodyAllocator,
        client_timeout: aiohttp.ClientTimeout,
    ) -> RawResponse:
        """One HTTP attempt: send, check the status, read the body into a buffer."""
        session = self._session_or_raise(url, request_id)
        self._attempts += 1
        progress = Progress()
        where = Attempt(method, url, path, request_id, client_timeout, progress)
        with translated(where):
            resp = await session.request(
                method,
                _join(url, path),
                data=data,
                headers=_GET_HEADERS if data is None else _JSON_HEADERS,
                timeout=client_timeout,
                allow_redirects=False,
            )
        complete = False
        try:
            if not 200 <= resp.status < 300:
                with translated(where):
                    excerpt = await read_excerpt(resp.content, progress)
                raise EngineStatusError(
                    f"engine answered HTTP {resp.status} {resp.reason or ''} to {method} {path}:"
                    f" {excerpt!r}",
                    status=resp.status,
                    body_excerpt=excerpt,
                    url=url,
                    request_id=request_id,
                )
            encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise EngineProtocolError(
                    f"answer to {method} {path} has Content-Encoding {encoding!r} although"
                    " identity was asked for; turn compression off on the engine's proxy",
                    url=url,
                    request_id=request_id,
                )
            owner, body = await self._read_body(resp, where, into)
            complete = True
            return RawResponse(
                url=url,
                status=resp.status,
                content_type=resp.content_type,
                headers=resp.headers,
                body=body,
                owner=owner,
                request_id=request_id,
            )
        finally:
            self._bytes_received += progress.received
            # release() keeps a fully read connection for reuse; close() drops a half-read one.
            if complete:
                resp.release()
            else:
                resp.close()

    async def _read_body(
        self, resp: aiohttp.ClientResponse, where: Attempt, into: BodyAllocator
    ) -> tuple[object, memoryview]:
        limit = self._config.max_body_bytes
        chunk_bytes = self._config.read_chunk_bytes
        progress = where.progress
        length = resp.content_length
        if length is not None:
            if length > limit:
                raise BodyTooLargeError(
                    f"body of {length} bytes (Content-Length) is over max_body_bytes={limit}:"
                    " refused unread; raise the limit or ask for fewer outputs per request",
                    url=where.url,
                    request_id=where.request_id,
                )
            progress.expected = length
            if length == 0:
                return None, memoryview(b"")
            owner = await into(length)
            view = writable_bytes(owner, length, url=where.url, request_id=where.request_id)
            with translated(where):
                await fill_view(resp.content, view, chunk_bytes, progress)
            if progress.received < length:
                raise EngineProtocolError(
                    truncated_message(where), url=where.url, request_id=where.request_id
                )
            return owner, view

        with translated(where):
            chunks = await read_all_chunks(
                resp.content,
                chunk_bytes,
                limit,
                progress,
                url=where.url,
                request_id=where.request_id,
            )
        total = progress.received
        if total == 0:
            return None, memoryview(b"")
        owner = await into(total)
        view = writable_bytes(owner, total, url=where.url, request_id=where.request_id)
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


def _join(url: str, path: str) -> str:
    if not path:
        return url
    return url.rstrip("/") + "/" + path.lstrip("/")


async def _parse_json(raw: RawResponse, method: str, path: str) -> Any:
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
