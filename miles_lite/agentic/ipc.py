"""The link between the session server's main process and one of its worker processes:
length-prefixed msgpack frames over a Unix-domain socket, anyio streams on both sides.

A frame is ``[kind, call, *args]``. ``call`` 0 is a notice (no answer); any other number
is a request, answered by a ``reply`` frame with the same number, a ``fail`` frame when it
raised (the asker raises :class:`~miles_lite.errors.WorkerTaskError` with its trace), or
not at all when the asker cancels it with a ``cancel`` frame (the answering side cancels
the request's work).
Both sides run the same :class:`Link`; what a side answers is its ``requests`` and
``notices`` callables. Requests are answered by reused tasks (an idle one is handed the
next request; a new one only when none is idle) and a call waits on a bare future: the
main process answers a request every turn, and an anyio task started for each cost more
CPU than the hand-over.

Turn records cross as packed arrays (:func:`pack_record`): token ids as ``array('i')``
bytes, log-probs as ``array('d')`` bytes, one C-speed copy each way, never a Python
object per token on the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from traceback import format_exc
from typing import Any

import anyio
import msgspec
from anyio.abc import ByteStream, TaskGroup

from miles_lite._core.idle import IdleWorkers
from miles_lite.errors import WorkerCrashedError, WorkerTaskError
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.types import WeightSpan

__all__ = ["Link", "pack_record", "unpack_record"]

_log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
#: msgspec's msgpack codec, on both ends of every link: a turn's send frame (500 ids)
#: encodes in 3.6 us against the msgpack package's 13.8, and decodes in 15.4 against 17.9.
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()
#: What one read of the link takes at most (bytes).
_READ_BYTES = 1 << 16
#: Requests a read starts before the reader yields to the loop. A burst of frames (under
#: load one read holds tens of turns' sends) would otherwise start every request in one
#: loop step and run all their first steps in the next: tens of engine sends' setup
#: between two turns of the rollout's other tasks (its driver, its timers). The total work
#: is the same, spread over loop steps (text_layer.py's agents-out-procs@256, 1 ms ticker,
#: the loop's CPU in a tick, p99: 7.6-9.3 ms with four, 10-14 with eight, 18-22 unbounded;
#: one a step: 5.9 ms, at more CPU a turn).
_REQUESTS_A_STEP = 4

#: What a side answers: ``requests(kind, args)`` for a request (its value is the reply;
#: run in a task of its own, cancelled by a ``cancel`` frame), ``notices(kind, args)``
#: for a notice (run inline, in frame order).
Requests = Callable[[str, list[Any]], Awaitable[Any]]
Notices = Callable[[str, list[Any]], None]
#: A request for an answerer: what answers it, its kind, call number, arguments and scope.
_Job = tuple[Requests, str, int, list[Any], anyio.CancelScope]


class Link:
    """One end of a main-worker link over ``stream`` (see the module docstring). ``peer``
    names the other end in errors. :meth:`serve` reads frames until the other end goes
    away; requests still waiting then raise :class:`~miles_lite.errors.WorkerCrashedError`."""

    def __init__(self, stream: ByteStream, peer: str) -> None:
        self._stream = stream
        self._peer = peer
        #: Frames waiting for the writer task, which sends all that wait in one write.
        self._outbox: list[bytes] = []
        self._queued = anyio.Event()
        #: Frames queued, and sent, so far; ``_progress`` is set after each write.
        self._put_count = 0
        self._sent_count = 0
        self._progress = anyio.Event()
        self._calls = itertools.count(1)
        #: Calls awaiting their reply: a future each (its value the reply, or the error).
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._running: dict[int, anyio.CancelScope] = {}
        #: Answerers waiting for a request (see :meth:`_answerer`), answerer tasks started
        #: so far, and those still running (idle ones included).
        self._idle: IdleWorkers[_Job] = IdleWorkers()
        self.answerers_started = 0
        self.answerers = 0
        self.lost: str | None = None

    async def post(self, kind: str, *args: Any) -> None:
        """Send a notice (queued: frames go out in the order they were queued)."""
        self._put([kind, 0, *args])

    async def flushed(self) -> None:
        """Return once every frame queued so far was handed to the socket (or the link
        is lost)."""
        target = self._put_count
        while self._sent_count < target and self.lost is None:
            await self._progress.wait()

    async def call(self, kind: str, *args: Any) -> Any:
        """Send a request and return its reply. Cancellation sends ``cancel`` (shielded,
        bounded), so the other side stops the request's work. Raises
        :class:`~miles_lite.errors.WorkerCrashedError` when the other end is gone."""
        self._check_lost()
        call = next(self._calls)
        pending = self._pending[call] = asyncio.get_running_loop().create_future()
        try:
            self._put([kind, call, *args])
            return await pending
        finally:
            self._pending.pop(call, None)
            if pending.cancelled() and self.lost is None:  # the asker went away
                self._put(["cancel", call])

    async def serve(self, requests: Requests, notices: Notices, tg: TaskGroup) -> None:
        """Read frames until the other end closes the link: replies resolve
        :meth:`call`, requests run in answerer tasks in ``tg``, notices inline. Returns
        once the link is lost (:attr:`lost` says why); pending calls then fail and idle
        answerers end."""
        try:
            async with anyio.create_task_group() as writing:
                writing.start_soon(self._writer)
                await self._read(requests, notices, tg)
                writing.cancel_scope.cancel()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
            self.lost = f"the link to {self._peer} closed"
        except anyio.ClosedResourceError:
            self.lost = f"the link to {self._peer} was closed here"
        finally:
            if self.lost is None:  # cancelled
                self.lost = f"the link to {self._peer} was closed here"
            self._progressed()
            self._fail_pending()
            self._idle.release()  # nothing more to answer: idle answerers end

    async def _read(self, requests: Requests, notices: Notices, tg: TaskGroup) -> None:
        started = 0
        try:
            async for frame in self._frames():
                kind, call, args = frame[0], frame[1], frame[2:]
                if kind == "reply":
                    self._resolve(call, args[0])
                elif kind == "fail":
                    self._fail(call, args[0], args[1])
                elif kind == "cancel":
                    scope = self._running.get(call)
                    if scope is not None:
                        scope.cancel()
                elif call:
                    scope = self._running[call] = anyio.CancelScope()
                    job = (requests, kind, call, args, scope)
                    if not self._idle.hand(job):
                        self.answerers_started += 1
                        self.answerers += 1
                        tg.start_soon(self._answerer, job)
                    started += 1
                    if started % _REQUESTS_A_STEP == 0:
                        await anyio.lowlevel.checkpoint()
                else:
                    try:
                        notices(kind, args)
                    except Exception:  # one bad notice must not end the link
                        _log.exception("%s: a %r notice failed", self._peer, kind)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
            self.lost = f"the link to {self._peer} closed"
        except anyio.ClosedResourceError:
            self.lost = f"the link to {self._peer} was closed here"

    async def _writer(self) -> None:
        """Send what waits in the outbox, all of it in one write (under load, many
        frames), until the link is lost."""
        try:
            while True:
                await self._queued.wait()
                self._queued = anyio.Event()
                data = b"".join(self._outbox)
                self._outbox.clear()
                count = self._put_count
                await self._stream.send(data)
                self._sent_count = count
                self._progressed()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.lost = f"the link to {self._peer} closed"
            self._progressed()
            await self.aclose()  # the reader sees it and ends too

    def _progressed(self) -> None:
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    async def _frames(self) -> AsyncIterator[list[Any]]:
        """The frames as they come: one read takes whatever arrived (under load, many
        frames), each frame is cut from it (no await per frame)."""
        buffer = bytearray()
        header = _HEADER.size
        while True:
            buffer += await self._stream.receive(_READ_BYTES)
            start = 0
            while len(buffer) - start >= header:
                (size,) = _HEADER.unpack_from(buffer, start)
                end = start + header + size
                if end > len(buffer):
                    break
                yield _DECODER.decode(memoryview(buffer)[start + header : end])
                start = end
            del buffer[:start]

    async def aclose(self) -> None:
        """Close the stream (bounded, shielded)."""
        with anyio.move_on_after(1.0, shield=True):
            await self._stream.aclose()

    async def _answerer(self, job: _Job | None) -> None:
        """Answer the requests handed to this task, one at a time, each in its own scope
        (a ``cancel`` frame cancels that request alone), waiting idle between them, until
        the link is lost."""
        try:
            while job is not None:
                requests, kind, call, args, scope = job
                try:
                    with scope:
                        try:
                            frame = ["reply", call, await requests(kind, args)]
                        except Exception as exc:  # the asker gets it, with its trace
                            frame = ["fail", call, f"{type(exc).__name__}: {exc}", format_exc()]
                        self._put(frame)
                finally:
                    self._running.pop(call, None)
                if self.lost is not None:
                    return
                job = await self._idle.wait()
        finally:
            self.answerers -= 1

    def _resolve(self, call: int, value: Any) -> None:
        pending = self._pending.get(call)
        if pending is not None and not pending.done():
            pending.set_result(value)

    def _fail(self, call: int, message: str, trace: str) -> None:
        pending = self._pending.get(call)
        if pending is not None and not pending.done():
            error = WorkerTaskError(
                f"{self._peer} failed the request: {message}", remote_traceback=trace
            )
            pending.set_exception(error)

    def _fail_pending(self) -> None:
        for pending in self._pending.values():
            if not pending.done():
                error = WorkerCrashedError(f"{self.lost}: {self._peer} did not answer")
                pending.set_exception(error)
        self._pending.clear()
        for scope in self._running.values():
            scope.cancel()

    def _check_lost(self) -> None:
        if self.lost is not None:
            raise WorkerCrashedError(f"{self.lost}; nothing more can be asked of {self._peer}")

    def _put(self, frame: list[Any]) -> None:
        """Queue ``frame`` for the writer task; dropped once the link is lost."""
        if self.lost is not None:
            return
        data = _ENCODER.encode(frame)
        self._outbox += (_HEADER.pack(len(data)), data)
        self._put_count += 1
        self._queued.set()


def pack_record(record: TurnRecord) -> list[Any]:
    """``record`` as msgpack-ready values, its per-token lists as packed arrays."""
    return [
        record.rid,
        record.engine_url,
        array("i", record.prompt_ids).tobytes(),
        array("i", record.output_ids).tobytes(),
        array("d", record.output_log_probs).tobytes(),
        record.finish_reason,
        record.weight_version,
        [[s.version, s.start, s.end, s.kv_version] for s in record.weight_spans],
        record.cached_tokens,
        record.prefix_len,
        record.request,
        record.response,
    ]


def unpack_record(packed: list[Any]) -> TurnRecord:
    """The :class:`TurnRecord` :func:`pack_record` packed."""
    (
        rid,
        url,
        prompt,
        output,
        log_probs,
        finish,
        version,
        spans,
        cached,
        prefix,
        request,
        response,
    ) = packed
    return TurnRecord(
        rid=rid,
        engine_url=url,
        prompt_ids=_unpacked("i", prompt),
        output_ids=_unpacked("i", output),
        output_log_probs=_unpacked("d", log_probs),
        finish_reason=finish,
        weight_version=version,
        weight_spans=tuple(WeightSpan(v, start, end, kv) for v, start, end, kv in spans),
        cached_tokens=cached,
        prefix_len=prefix,
        request=request,
        response=response,
    )


def _unpacked(typecode: str, data: bytes) -> list[Any]:
    values = array(typecode)
    values.frombytes(data)
    return values.tolist()
