"""The text stand-in's HTTP server: its routes, each to the handler of its concern, and
starting and stopping the aiohttp app on loopback."""

from __future__ import annotations

import anyio
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.testing.text.chat import ChatEndpoint
from miles_lite.testing.text.control import ControlEndpoints
from miles_lite.testing.text.generate import GenerateEndpoint

__all__ = ["make_app", "start_app", "stop_app"]

#: A request body may be this large (a long batch of prompts).
_MAX_BODY = 64 << 20
#: How long stopping waits for the server's cleanup, in seconds.
_STOP_TIMEOUT_S = 5.0


def make_app(
    generate: GenerateEndpoint, chat: ChatEndpoint, control: ControlEndpoints
) -> web.Application:
    """The aiohttp app: SGLang's routes (with their deprecated aliases) and the stand-in's."""
    app = web.Application(client_max_size=_MAX_BODY)
    post, get = app.router.add_post, app.router.add_get
    post("/generate", generate.handle)
    post("/v1/chat/completions", chat.handle)
    post("/abort_request", control.abort_request)
    get("/v1/loads", control.loads)
    get("/get_loads", control.loads)
    post("/update_weight_version", control.update_weight_version)
    post("/update_weights_from_disk", control.update_weights_from_disk)
    post("/pause_generation", control.pause)
    post("/continue_generation", control.continue_)
    get("/health", control.health)
    get("/health_generate", control.health)
    get("/model_info", control.model_info)
    get("/get_model_info", control.model_info)
    get("/server_info", control.server_info)
    get("/get_server_info", control.server_info)
    get("/v1/models", control.models)
    post("/flush_cache", control.flush_cache)
    get("/_stand_in/stats", control.stats)
    return app


async def start_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on ``host:port`` (0: a free port); its runner and URL."""
    return await serve_app(app, host, port)


async def stop_app(runner: web.AppRunner) -> None:
    """Stop serving: shielded, and bounded by a few seconds."""
    with anyio.move_on_after(_STOP_TIMEOUT_S, shield=True):
        await runner.cleanup()
