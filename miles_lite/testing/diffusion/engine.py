"""A stand-in SGLang diffusion engine: an aiohttp server on loopback speaking the real wire.

Endpoints (SGLang's, see ``shared/sglang/WIRE.md`` sections 3 and 4):

- ``POST /rollout/generate``: ``num_outputs_per_prompt`` synthetic samples
  (:func:`~miles_lite.testing.synthetic_sample`) in the config's wire form. Errors: 422
  for a body that is not a JSON object or has a wrongly typed field, 400 ``{"detail":
  "Invalid sampling params: ..."}`` for a bad value, 500 ``{"detail": ...}`` after the
  generation time when ``seed`` is missing or null, 503 while warming up.
- ``GET /health``, ``/health_generate``: 200 empty; 503 while warming up or unhealthy.
- ``GET /model_info`` (and the deprecated ``/get_model_info``), ``GET /server_info``,
  ``GET /v1/models``: JSON shaped like SGLang's.
- ``POST /abort_request`` ``{"rid": prefix}`` or ``{"abort_all": true}``: 200 empty. Every
  generating or queued request whose rid starts with the prefix answers at once with
  **200 and an empty sample list** (``[]`` in the wire form). A request's rid is its
  ``rid`` field, else its ``request_id``, else a fresh uuid4 hex.

Stand-in controls (not SGLang's): ``GET``/``POST /_stand_in/faults`` reads/sets
:class:`~miles_lite.testing.Faults` from JSON; ``GET /_stand_in/stats`` gives
:class:`~miles_lite.testing.EngineStats` as JSON; ``POST /_stand_in/stats/reset`` zeroes it.

Timing: a request waits for one of ``max_concurrent`` slots, then sleeps
``num_inference_steps * step_latency_s`` while its body is built in a worker thread, and
answers when both are done. Bodies are written in 1 MiB chunks so the loop stays free.
Building a large body holds the GIL in the encoders for a while: benchmarks run engines
in their own process (:class:`~miles_lite.testing.EngineProcess`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.testing.diffusion.body import body_pieces, empty_body
from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.faults import Faults
from miles_lite.testing.diffusion.info import model_info, model_list, server_info
from miles_lite.testing.diffusion.request import InvalidRequestError, RolloutRequest
from miles_lite.testing.diffusion.stats import EngineStats
from miles_lite.testing.errors import StandInError

__all__ = ["StandInEngine"]

#: Bodies are written in chunks of this many bytes (each write waits for the socket).
_CHUNK = 1 << 20
#: What a ``corrupt_body_next`` fault sends: neither msgpack (0xc1 is never used) nor JSON.
_GARBAGE = b"\xc1\xc1stand-in corrupt body\xc1\xc1"
#: How long ``aclose()`` lets answers already being written finish, in seconds.
_SHUTDOWN_TIMEOUT_S = 1.0


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


class StandInEngine:
    """A stand-in SGLang diffusion server on loopback (see the module docstring).

    Usage::

        async with StandInEngine(StandInConfig(step_latency_s=0.01)) as engine:
            engine.faults.status_next = [503]
            ...  # POST f"{engine.url}/rollout/generate"
            assert engine.stats.requests_served == 1

    ``faults`` and ``stats`` may be read and changed at any time. Must run on asyncio
    (aiohttp). ``aclose()`` answers requests still waiting or generating with a 503,
    waits up to 1 s for answers being written, and is idempotent; a closed engine cannot
    be started again (:class:`~miles_lite.testing.StandInError`).
    """

    def __init__(self, config: StandInConfig | None = None) -> None:
        self.config = config if config is not None else StandInConfig()
        self.faults = Faults()
        self.stats = EngineStats(requests=deque(maxlen=self.config.request_log_limit))
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._closed = False
        self._ready_at = 0.0
        self._created = int(time.time())
        self._calls: set[_Call] = set()
        self._slots: anyio.Semaphore | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._body_cache: dict[str, list[memoryview]] = {}
        self._body_cache_size = 0
        self._stats_changed: anyio.Event | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server; RuntimeError before ``start()``."""
        if self._url is None:
            raise RuntimeError("StandInEngine.url is known once the engine has started")
        return self._url

    async def start(self) -> None:
        """Bind and serve. Raises :class:`~miles_lite.testing.StandInError` after
        ``aclose()`` or if already started, OSError if the port is taken."""
        if self._closed:
            raise StandInError("this StandInEngine was closed; create a new one")
        if self._runner is not None:
            raise StandInError("StandInEngine.start() called twice")
        self._slots = anyio.Semaphore(self.config.max_concurrent)
        self._limiter = anyio.CapacityLimiter(self.config.max_concurrent)
        self._stats_changed = anyio.Event()
        self._runner, self._url = await serve_app(
            self._make_app(),
            self.config.host,
            self.config.port,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        self._ready_at = anyio.current_time() + self.config.warmup_s

    async def aclose(self) -> None:
        """Stop serving (see the class docstring); shielded and bounded, idempotent."""
        if self._closed:
            return
        self._closed = True
        for call in list(self._calls):
            call.scope.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.move_on_after(_SHUTDOWN_TIMEOUT_S + 5.0, shield=True):
                await runner.cleanup()

    async def __aenter__(self) -> StandInEngine:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests waiting or generating whose rid starts with ``rid`` (or all).

        They answer 200 with an empty sample list. Returns how many were aborted; an rid
        that matches nothing is ignored, as SGLang does.
        """
        count = 0
        for call in list(self._calls):
            if call.rid is not None and (
                abort_all or (rid is not None and call.rid.startswith(rid))
            ):
                call.aborted = True
                call.scope.cancel()
                count += 1
        return count

    async def wait_stats(self, predicate: Callable[[EngineStats], bool]) -> None:
        """Wait until ``predicate(self.stats)`` is true, re-checking at each change.

        Changes are: a request received, a generation starting or ending, a request
        answered. No timeout of its own: wrap it in ``anyio.fail_after``. RuntimeError
        before ``start()``.
        """
        while True:
            changed = self._stats_changed
            if changed is None:
                raise RuntimeError("StandInEngine.wait_stats() before start()")
            if predicate(self.stats):
                return
            await changed.wait()

    def _notify(self) -> None:
        if self._stats_changed is not None:
            self._stats_changed.set()
            self._stats_changed = anyio.Event()

    def is_ready(self) -> bool:
        """Whether warm-up is over (``/health`` then answers 200 unless unhealthy)."""
        return self._runner is not None and anyio.current_time() >= self._ready_at

    # -- the application ------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/rollout/generate", self._rollout_generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/abort_request", self._abort_request)
        app.router.add_get("/_stand_in/faults", self._get_faults)
        app.router.add_post("/_stand_in/faults", self._set_faults)
        app.router.add_get("/_stand_in/stats", self._get_stats)
        app.router.add_post("/_stand_in/stats/reset", self._reset_stats)
        return app

    async def _rollout_generate(self, request: web.Request) -> web.StreamResponse:
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
            raise RuntimeError("StandInEngine served a request before start()")
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

    async def _health(self, request: web.Request) -> web.Response:
        if not self.is_ready() or self.faults.unhealthy:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response(model_info(self.config))

    async def _server_info(self, request: web.Request) -> web.Response:
        runner = self._runner
        port = runner.addresses[0][1] if runner is not None else self.config.port
        return web.json_response(server_info(self.config, port=port))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(model_list(self.config, created=self._created))

    async def _abort_request(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None
        rid = body.get("rid") if isinstance(body, dict) else None
        abort_all = body.get("abort_all", False) if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or not isinstance(rid, (str, type(None)))
            or not isinstance(abort_all, bool)
        ):
            return web.json_response(
                {
                    "detail": [
                        {
                            "type": "model_attributes_type",
                            "loc": ["body"],
                            "msg": 'expected {"rid": str} or {"abort_all": bool}',
                            "input": body,
                        }
                    ]
                },
                status=422,
            )
        self.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_json())

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            changes = json.loads(await request.read())
        except ValueError as exc:
            return web.json_response({"detail": f"fault switches must be JSON: {exc}"}, status=400)
        if not isinstance(changes, dict):
            return web.json_response({"detail": "fault switches must be a JSON object"}, status=400)
        try:
            self.faults.update(changes)
        except ValueError as exc:
            return web.json_response({"detail": str(exc)}, status=400)
        return web.json_response(self.faults.to_json())

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.to_json())

    async def _reset_stats(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return web.json_response(self.stats.to_json())


def _close_transport(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.close()
