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
answers when both are done. Bodies are written in 1 MiB chunks so the loop stays free
(:mod:`miles_lite.testing.diffusion.generate` answers ``/rollout/generate``; this module
owns the engine's life, its routes and the other endpoints).
Building a large body holds the GIL in the encoders for a while: benchmarks run engines
in their own process (:class:`~miles_lite.testing.EngineProcess`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable

import anyio
from aiohttp import web

from miles_lite._core.resources import AsyncResource, ResourceState
from miles_lite._core.serve import serve_app
from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.faults import Faults
from miles_lite.testing.diffusion.generate import RolloutEndpoint
from miles_lite.testing.diffusion.info import model_info, model_list, server_info
from miles_lite.testing.diffusion.stats import EngineStatistics, EngineStats
from miles_lite.testing.errors import StandInError

__all__ = ["StandInEngine"]

#: How long ``aclose()`` lets answers already being written finish, in seconds.
_SHUTDOWN_TIMEOUT_S = 1.0


class StandInEngine(AsyncResource):
    """A stand-in SGLang diffusion server on loopback (see the module docstring).

    Usage::

        async with StandInEngine(StandInConfig(step_latency_s=0.01)) as engine:
            engine.faults.status_next = [503]
            ...  # POST f"{engine.url}/rollout/generate"
            assert engine.stats.requests_served == 1

    ``faults`` and ``stats`` may be read and changed at any time (``stats`` is live;
    :meth:`statistics` is a frozen snapshot). Must run on asyncio (aiohttp).
    ``aclose()`` answers requests still waiting or generating with a 503, waits up to 1 s
    for answers being written, and is idempotent; a closed engine cannot be started again
    (:meth:`start` raises :class:`~miles_lite.testing.StandInError`; the lifecycle is
    the library's one, :class:`~miles_lite._core.resources.AsyncResource`).
    """

    _resource_name = "StandInEngine"

    def __init__(self, config: StandInConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else StandInConfig()
        self.faults = Faults()
        self.stats = EngineStats(requests=deque(maxlen=self.config.request_log_limit))
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._ready_at = 0.0
        self._created = int(time.time())
        self._stats_changed: anyio.Event | None = None
        self._rollout = RolloutEndpoint(
            self.config, self.faults, self.stats, notify=self._notify, is_ready=self.is_ready
        )

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server; RuntimeError before ``start()``."""
        if self._url is None:
            raise RuntimeError("StandInEngine.url is known once the engine has started")
        return self._url

    async def start(self) -> None:
        """Bind and serve (as ``async with`` does). Raises
        :class:`~miles_lite.testing.StandInError` after ``aclose()`` or if already
        started, OSError if the port is taken."""
        if self.state is ResourceState.CLOSED:
            raise StandInError("this StandInEngine was closed; create a new one")
        if self.state is ResourceState.OPEN:
            raise StandInError("StandInEngine.start() called twice")
        await self.__aenter__()

    async def _open(self) -> None:
        self._rollout.start()
        self._stats_changed = anyio.Event()
        self._runner, self._url = await serve_app(
            self._make_app(),
            self.config.host,
            self.config.port,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        self._ready_at = anyio.current_time() + self.config.warmup_s

    async def _close(self) -> None:
        """Stop serving (see the class docstring); shielded and bounded."""
        self._rollout.cancel_all()
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.move_on_after(_SHUTDOWN_TIMEOUT_S + 5.0, shield=True):
                await runner.cleanup()

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests waiting or generating whose rid starts with ``rid`` (or all).

        They answer 200 with an empty sample list. Returns how many were aborted; an rid
        that matches nothing is ignored, as SGLang does.
        """
        return self._rollout.abort(rid, abort_all=abort_all)

    def statistics(self) -> EngineStatistics:
        """A frozen snapshot of :attr:`stats` (which stays live)."""
        return self.stats.snapshot()

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
        app.router.add_post("/rollout/generate", self._rollout.handle)
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
