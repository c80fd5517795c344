"""The diffusion stand-in's ``POST /rollout/generate``: faults, batch slots, bodies, sending.

A request is read and logged, goes through the fault switches
(:class:`~miles_lite.testing.Faults`, in their documented order), is checked
(:class:`~miles_lite.testing.RolloutRequest`), waits for one of ``max_concurrent`` slots,
then sleeps ``num_inference_steps * step_latency_s`` while its body is built in a worker
thread, and answers when both are done. Bodies are written in 1 MiB chunks so the loop
stays free. An aborted request answers 200 with an empty sample list; one still running
when the engine closes answers 503. Every request ends in one outcome counter of
:class:`~miles_lite.testing.EngineStats` (served, aborted or failed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from aiohttp import web

from miles_lite.testing.diffusion.body import body_pieces, empty_body
from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.faults import Faults
from miles_lite.testing.diffusion.request import InvalidRequestError, RolloutRequest
from miles_lite.testing.diffusion.stats import EngineStats

__all__ = ["RolloutEndpoint"]

#: Bodies are written in chunks of this many bytes (each write waits for the socket).
_CHUNK = 1 << 20
#: What a ``corrupt_body_next`` fault sends: neither msgpack (0xc1 is never used) nor JSON.
_GARBAGE = b"\xc1\xc1stand-in corrupt body\xc1\xc1"


@dataclass(eq=False)
class _Answer:
    """What to send back: ``pieces`` of a body, or ``drop`` the connection."""

    status: int = 200
    pieces: list[memoryview] = field(default_factory=list)
    content_type: str = "application/json"
    outcome: str = "failed"  # "served", "aborted" or "failed": the stats counter it feeds
    samples: int = 0
    drop: bool = False
    truncate: bool = False


@dataclass(eq=False)
class _Call:
    """One ``/rollout/generate`` in progress; ``rid`` is set while it may be aborted."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    rid: str | None = None
    aborted: bool = False


def _json_answer(status: int, payload: Any) -> _Answer:
    return _Answer(status=status, pieces=[memoryview(json.dumps(payload).encode())])


class RolloutEndpoint:
    """``POST /rollout/generate`` of one engine (see the module docstring).

    It shares ``config``, ``faults`` and ``stats`` with its engine, calls ``notify`` at
    each change of the statistics and asks ``is_ready`` whether warm-up is over.
    :meth:`start` makes its slots (on the engine's event loop); :meth:`abort` and
    :meth:`cancel_all` end requests in progress.
    """

    def __init__(
        self,
        config: StandInConfig,
        faults: Faults,
        stats: EngineStats,
        *,
        notify: Callable[[], None],
        is_ready: Callable[[], bool],
    ) -> None:
        self.config = config
        self.faults = faults
        self.stats = stats
        self._notify = notify
        self.is_ready = is_ready
        self._calls: set[_Call] = set()
        self._slots: anyio.Semaphore | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._body_cache: dict[str, list[memoryview]] = {}
        self._body_cache_size = 0

    def start(self) -> None:
        """Make the batch slots and the body builders' limiter (on the event loop)."""
        self._slots = anyio.Semaphore(self.config.max_concurrent)
        self._limiter = anyio.CapacityLimiter(self.config.max_concurrent)

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests waiting or generating whose rid starts with ``rid`` (or all);
        they answer 200 with an empty sample list. Returns how many."""
        count = 0
        for call in list(self._calls):
            if call.rid is not None and (
                abort_all or (rid is not None and call.rid.startswith(rid))
            ):
                call.aborted = True
                call.scope.cancel()
                count += 1
        return count

    def cancel_all(self) -> None:
        """End every request in progress (they answer 503: the engine is closing)."""
        for call in list(self._calls):
            call.scope.cancel()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one ``POST /rollout/generate`` (the route's handler)."""
        self.stats.requests_received += 1
        self._notify()
        call = _Call()
        self._calls.add(call)
        try:
            with call.scope:
                answer = await self._answer(request, call)
            if call.scope.cancelled_caught:
                if call.aborted:
                    answer = _Answer(
                        pieces=[memoryview(empty_body(self.config))],
                        content_type=self.config.content_type,
                        outcome="aborted",
                    )
                else:
                    answer = _json_answer(503, {"detail": "the stand-in engine is shutting down"})
        finally:
            self._calls.discard(call)
        return await self._send(request, answer)

    async def _answer(self, request: web.Request, call: _Call) -> _Answer:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _json_answer(
                422,
                {
                    "detail": [
                        {
                            "type": "json_invalid",
                            "loc": ["body", 0],
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": str(exc)},
                        }
                    ]
                },
            )
        self.stats.requests.append(body)
        if not self.is_ready():
            return _json_answer(503, {"detail": "the stand-in engine is warming up"})
        faults = self.faults
        if faults.stall_next > 0:
            faults.stall_next -= 1
            await anyio.sleep(faults.stall_s)
        if faults.drop_connection_next > 0:
            faults.drop_connection_next -= 1
            return _Answer(drop=True)
        if faults.status_next:
            status = faults.status_next.pop(0)
            return _json_answer(status, {"detail": f"stand-in fault: status {status}"})
        if faults.corrupt_body_next > 0:
            faults.corrupt_body_next -= 1
            return _Answer(pieces=[memoryview(_GARBAGE)], content_type=self.config.content_type)
        try:
            parsed = RolloutRequest.parse(body, self.config)
        except InvalidRequestError as exc:
            return _json_answer(exc.status, {"detail": exc.detail})
        if parsed.rid is None:
            parsed = dataclasses.replace(parsed, rid=uuid.uuid4().hex)
        call.rid = parsed.rid
        answer = await self._generate(parsed)
        call.rid = None
        if answer.outcome == "served" and faults.truncate_body_next > 0:
            faults.truncate_body_next -= 1
            answer.truncate = True
            answer.outcome = "failed"
        return answer

    async def _generate(self, parsed: RolloutRequest) -> _Answer:
        slots, limiter = self._slots, self._limiter
        if slots is None or limiter is None:
            raise RuntimeError("RolloutEndpoint served a request before start()")
        stats = self.stats
        waiting = True
        stats.requests_waiting += 1
        try:
            async with slots:
                waiting = False
                stats.requests_waiting -= 1
                stats.generations_in_flight += 1
                stats.max_generations_in_flight = max(
                    stats.max_generations_in_flight, stats.generations_in_flight
                )
                self._notify()
                try:
                    return await self._run_generation(parsed, limiter)
                finally:
                    stats.generations_in_flight -= 1
        finally:
            if waiting:
                stats.requests_waiting -= 1
            self._notify()

    async def _run_generation(
        self, parsed: RolloutRequest, limiter: anyio.CapacityLimiter
    ) -> _Answer:
        pieces: list[memoryview] = []
        cache_key = repr(dataclasses.replace(parsed, rid=None))

        async def build() -> None:
            cached = self._body_cache.get(cache_key)
            if cached is not None:
                pieces.extend(cached)
                return
            make = functools.partial(
                body_pieces, parsed, self.config, between_samples=anyio.from_thread.check_cancelled
            )
            pieces.extend(
                await anyio.to_thread.run_sync(make, abandon_on_cancel=True, limiter=limiter)
            )
            self._remember(cache_key, pieces)

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep, parsed.num_inference_steps * self.config.step_latency_s)
            if parsed.seed is not None:
                tg.start_soon(build)
        if parsed.seed is None:
            # SGLang runs the whole generation, then fails building the per-sample seeds.
            return _json_answer(
                500,
                {
                    "detail": "Generation failed: seed is None (unsupported operand type(s) "
                    "for +: 'NoneType' and 'int'); send an integer seed"
                },
            )
        return _Answer(
            pieces=pieces,
            content_type=self.config.content_type,
            outcome="served",
            samples=parsed.num_outputs_per_prompt,
        )

    def _remember(self, key: str, pieces: list[memoryview]) -> None:
        size = sum(len(p) for p in pieces)
        if size + self._body_cache_size > self.config.body_cache_bytes:
            return
        self._body_cache[key] = list(pieces)
        self._body_cache_size += size

    async def _send(self, request: web.Request, answer: _Answer) -> web.StreamResponse:
        if answer.drop:
            _close_transport(request)
            self._count("failed")
            return web.Response()
        total = sum(len(piece) for piece in answer.pieces)
        response = web.StreamResponse(status=answer.status)
        response.content_type = answer.content_type
        response.content_length = total
        await response.prepare(request)
        budget = total // 2 if answer.truncate else total
        for piece in answer.pieces:
            for start in range(0, len(piece), _CHUNK):
                if budget <= 0:
                    break
                chunk = piece[start : start + min(_CHUNK, budget)]
                await response.write(chunk)
                budget -= len(chunk)
        if answer.truncate:
            _close_transport(request)
            self._count("failed")
            return response
        await response.write_eof()
        self._count(answer.outcome, samples=answer.samples, nbytes=total)
        return response

    def _count(self, outcome: str, *, samples: int = 0, nbytes: int = 0) -> None:
        stats = self.stats
        if outcome == "served":
            stats.requests_served += 1
            stats.samples_served += samples
            stats.bytes_served += nbytes
        elif outcome == "aborted":
            stats.requests_aborted += 1
        else:
            stats.requests_failed += 1
        self._notify()


def _close_transport(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.close()
