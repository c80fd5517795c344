"""The seam between the engine client and HTTP: one exchange at a time, errors translated.

:class:`AsyncTransport` sends one request and gives back a :class:`ResponseStream` whose
body is read piece by piece, or straight into the caller's buffer; every failure arrives
already translated (:mod:`miles_lite.engine.http._errors`). Two implement it (httpx's
``_transports/base.py``, ``default.py``, ``mock.py``):
:class:`~miles_lite.engine.http.aiohttp_transport.AiohttpTransport`, the real one, and
:class:`~miles_lite.engine.http.mock.MockTransport`, which answers from a handler function
for unit tests of the client and the router without a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from miles_lite.engine.http._errors import Attempt

__all__ = ["AsyncTransport", "Request", "ResponseStream"]


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a transport sends it: ``attempt`` names it in errors; ``body`` is
    JSON bytes (``None``: no body, a GET); ``headers`` are this request's own (a sticky
    key for SGLang's router), sent over the client's; ``control``: a control call, sent
    on connections generations never hold (``control_connections_per_host``)."""

    attempt: Attempt
    body: bytes | None = None
    headers: Mapping[str, str] | None = None
    control: bool = False

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
