"""The text stand-in's control and info endpoints, answering as SGLang 0.5.23 does.

``POST /abort_request`` (rid prefix or ``abort_all``), ``GET /v1/loads`` (SGLang's
LoadSnapshot keys, ``?include=``), ``POST /update_weight_version``,
``/update_weights_from_disk``, ``/pause_generation`` (``abort`` / ``retract`` /
``in_place``), ``/continue_generation``, ``/flush_cache``, ``GET /health``,
``/health_generate`` (503 during warm-up), ``/model_info``, ``/server_info``,
``/v1/models``; and the stand-in's own ``GET /_stand_in/stats`` (its statistics as JSON).

The weight-update traps of SGLang 0.5.23 are kept: ``/update_weight_version`` aborts every
request unless ``abort_all_requests`` is false; ``/update_weights_from_disk`` flushes the
cache by default, and when it cannot (requests running, or held ``in_place``) it answers
400 *after* the weights (and the tokens' version) changed, while ``/model_info`` keeps
the old version; ``/flush_cache`` answers 400 ``Flush cache failed.`` while requests run.
With the tiny model, the update loads the folder's weights (:meth:`TinyModel.load`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread
from aiohttp import web

from miles_lite.testing.text.config import SGLANG_VERSION
from miles_lite.testing.text.generate import error_response
from miles_lite.testing.text.scheduler import PAUSE_MODES, Scheduler
from miles_lite.testing.text.state import EngineState
from miles_lite.testing.text.stats import TextEngineStatistics

__all__ = ["ControlEndpoints"]

_LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


async def _body(request: web.Request) -> Any:
    """The JSON body (an empty body is ``{}``); None if it does not parse."""
    try:
        return json.loads(await request.read() or b"{}")
    except ValueError:
        return None


class ControlEndpoints:
    """The control and info handlers of one engine (see the module docstring).

    ``url`` gives the engine's URL (``/server_info`` reports its port); ``statistics``
    its snapshot (``/_stand_in/stats``).
    """

    def __init__(
        self,
        state: EngineState,
        scheduler: Scheduler,
        *,
        url: Callable[[], str],
        statistics: Callable[[], TextEngineStatistics],
    ) -> None:
        self.state = state
        self.scheduler = scheduler
        self._url = url
        self._statistics = statistics

    async def abort_request(self, request: web.Request) -> web.Response:
        """``POST /abort_request``: 200 whatever it matched, as SGLang."""
        body = await _body(request)
        self.state.stats.aborts.append({} if body is None else body)
        if isinstance(body, dict):
            if body.get("abort_all"):
                self.scheduler.abort(abort_all=True)
            elif isinstance(body.get("rid"), str):
                self.scheduler.abort(body["rid"])
        return web.Response(status=200)

    async def loads(self, request: web.Request) -> web.Response:
        """``GET /v1/loads`` (and ``/get_loads``)."""
        include = request.query.get("include")
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= _LOAD_SECTIONS:
            return web.json_response(
                {
                    "detail": f"Invalid include sections: {sections - _LOAD_SECTIONS}. "
                    f"Valid options: {sorted(_LOAD_SECTIONS)}"
                },
                status=400,
            )
        config, stats = self.state.config, self.state.stats
        used = 0  # tokens held by running requests: their prompts and outputs so far
        load: dict[str, Any] = {
            "dp_rank": 0,
            "num_running_reqs": stats.running,
            "num_waiting_reqs": stats.waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": used,
            "num_total_tokens": used,
            "max_total_num_tokens": config.context_length * config.max_running,
            "max_running_requests": config.max_running,
            "token_usage": 0.0,
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": stats.running / config.max_running,
        }
        if sections is None or "all" in sections or "queues" in sections:
            load["queues"] = {"waiting": stats.waiting, "grammar": 0, "paused": 0, "retracted": 0}
        return web.json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "accelerator": None,
                "num_accelerators": 1,
                "loads": [load],
            }
        )

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """``POST /update_weight_version`` (``abort_all_requests`` aborts first)."""
        body = await _body(request)
        new = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(new, str):
            return error_response(400, "new_version must be a string")
        if body.get("abort_all_requests", True):
            self.scheduler.abort(abort_all=True)
        self.state.weight_version = self.state.info_version = new
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {new}", "new_version": new}
        )

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """``POST /update_weights_from_disk``: the tiny model loads ``model_path`` (the
        scripted policy has nothing to load); ``weight_version`` is set; the cache is
        flushed unless ``flush_cache`` is false (see the module docstring)."""
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return error_response(
                400, "update_weights_from_disk needs a body with a model_path string"
            )
        new = body.get("weight_version")
        if new is not None and not isinstance(new, str):
            return error_response(400, "weight_version must be a string")
        for key in ("flush_cache", "abort_all_requests"):
            if not isinstance(body.get(key, False), bool):
                return error_response(400, f"{key} must be a boolean")
        state = self.state
        if body.get("abort_all_requests", False):
            self.scheduler.abort(abort_all=True)
        if state.config.update_latency_s:
            await anyio.sleep(state.config.update_latency_s)  # reading the checkpoint
        model = state.model
        if model is not None:
            try:
                module = await anyio.to_thread.run_sync(model.load, body["model_path"])
            except (OSError, ValueError) as exc:
                return _update_answer(False, f"Failed to update weights: {exc}")
            model.model = module
            state.stats.weight_loads += 1
        message = "Succeeded to update model weights."
        if new is not None:
            state.weight_version = new  # the scheduler's: every token made from now on
        if body.get("flush_cache", True) and not self._flush():
            return _update_answer(
                False,
                "Weights were updated, but the cache was not flushed because requests are"
                " still running or queued. Retract or finish them, then call /flush_cache.",
            )
        if new is not None:
            state.info_version = new
            message += f" Weight version updated to {new}."
        return _update_answer(True, message)

    def _flush(self) -> bool:
        """Flush the prefix cache if nothing runs (or a retract pause holds it)."""
        if not self.scheduler.can_flush():
            self.state.stats.flush_refusals += 1
            return False
        self.state.cache.clear()
        self.scheduler.flushed()
        self.state.stats.flushes += 1
        return True

    async def pause(self, request: web.Request) -> web.Response:
        """``POST /pause_generation`` with ``{"mode": ...}`` (default ``abort``)."""
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in PAUSE_MODES:
            return error_response(
                400, 'pause_generation needs a body {"mode": abort|retract|in_place}'
            )
        self.scheduler.pause(mode)
        self.state.stats.pauses += 1
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_(self, request: web.Request) -> web.Response:
        """``POST /continue_generation``."""
        self.scheduler.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health`` and ``/health_generate``: 503 while warming up."""
        return web.Response(status=503 if self.state.warming() else 200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """``POST /flush_cache``: SGLang's plain-text answers (400 while requests run)."""
        if not self._flush():
            return web.Response(status=400, text="Flush cache failed.\n")
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are"
            " running or waiting requests, the operation will not be performed.)\n"
        )

    async def model_info(self, request: web.Request) -> web.Response:
        """``GET /model_info`` (and ``/get_model_info``)."""
        config = self.state.config
        return web.json_response(
            {
                "model_path": config.model_path,
                "tokenizer_path": config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.state.info_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """``GET /server_info`` (and ``/get_server_info``), with ``"stand_in": true``."""
        config = self.state.config
        return web.json_response(
            {
                "model_path": config.model_path,
                "tokenizer_path": config.model_path,
                "host": config.host,
                "port": int(self._url().rsplit(":", 1)[1]),
                "context_length": config.context_length,
                "max_running_requests": config.max_running,
                "served_model_name": config.model_path,
                "weight_version": self.state.info_version,
                "tool_call_parser": "qwen25",
                "reasoning_parser": None,
                "version": SGLANG_VERSION,
                "stand_in": True,
                "token_latency_s": config.token_latency_s,
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``."""
        config = self.state.config
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": config.model_path,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": config.model_path,
                        "parent": None,
                        "max_model_len": config.context_length,
                    }
                ],
            }
        )

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /_stand_in/stats``: :class:`TextEngineStatistics` as JSON."""
        return web.json_response(dataclasses.asdict(self._statistics()))


def _update_answer(success: bool, message: str) -> web.Response:
    """SGLang's weight-update answer: 200, or 400 with ``success`` false."""
    return web.json_response(
        {"success": success, "message": message, "num_paused_requests": 0},
        status=200 if success else 400,
    )
