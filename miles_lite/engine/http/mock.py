"""A transport without a socket, for unit tests of the client and the router (httpx's
``MockTransport``): :class:`MockTransport` answers every request from a handler function.

Why a test double beside the real-HTTP fakes (the test suite's scripted engine, the
stand-ins): it is public (a user's tests of their own generate function or router
settings need no server), it fails an exchange exactly as a :class:`Failure` says
(refused, a timeout after sending, a body cut at byte ``n``: :class:`MockFailure`,
``fail_after``) with no wall-clock wait and no race, and it shows every request the
"engine" received (``requests``) for the never-re-sent checks. What it cannot show, the
bytes on a socket and aiohttp's own errors, the package's tests cover over real HTTP
(a scripted aiohttp engine and a raw socket server, the stand-ins)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
from multidict import CIMultiDict, CIMultiDictProxy

from miles_lite.engine.http._errors import Attempt, Failure, engine_error
from miles_lite.engine.http.transport import Request, ResponseStream

__all__ = ["MockFailure", "MockResponse", "MockTransport"]


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
