"""A body received by the socket straight into the caller's buffer (``recv_into``).

Once aiohttp has parsed a response's head, :class:`InPlaceBody` takes over its connection:
it becomes the asyncio transport's protocol (a :class:`asyncio.BufferedProtocol` whose
buffer is the caller's view), so no bytes object is made and copied per read. The riskiest
code in the package, because it leans on aiohttp internals that no public API promises
(3.9 to 3.14 behave so):

- ``ClientResponse.connection`` is the pooled ``Connection`` still holding the socket
  while the body is unread, with ``.transport`` (an :class:`asyncio.Transport`) and
  ``.protocol`` (aiohttp's ``ResponseHandler``, its parser and ``StreamReader`` feeder);
- what aiohttp already read past the head sits in ``response.content`` and is taken with
  ``read_nowait`` first; aiohttp may have paused reading (its buffer was full), so the
  receiver resumes it;
- ``ResponseHandler.connection_lost`` must still be called when the socket closes, so
  aiohttp's bookkeeping ends as for any closed connection;
- the connection's parser was bypassed, so the connection must never go back to the pool:
  the caller closes the response (``response.close()``) rather than releasing it.

The bounds aiohttp would have kept (the read timeout since the last bytes, the total
timeout since the request was sent) are kept here. ``tests/engine/test_in_place_body.py``
pins every one of these against real loopback servers (the bytes, the connections the
server saw, a short body, a stall, a trickle, a cancelled caller, the size of each read);
run it after any aiohttp upgrade.
"""

from __future__ import annotations

import asyncio
import time

from miles_lite.engine.http._errors import Attempt, Failure, Progress, engine_error

__all__ = ["InPlaceBody"]

#: Where a detached receiver's socket reads go (none should come: the transport is paused).
_SCRATCH = bytearray(1 << 16)


class InPlaceBody(asyncio.BufferedProtocol):
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
