"""Serving an aiohttp app on loopback, for the session server and the stand-in engines."""

from __future__ import annotations

from typing import Any

import anyio
from aiohttp import web

__all__ = ["serve_app"]


async def serve_app(
    app: web.Application, host: str, port: int, **runner: Any
) -> tuple[web.AppRunner, str]:
    """Start ``app`` on ``host:port`` (0: a free port); return its runner (``cleanup()``
    stops it) and its ``http://`` URL. ``runner``: ``web.AppRunner`` options. Handlers are
    cancelled when their client goes away, and nothing is access-logged. A failed start
    leaves nothing running."""
    runner_ = web.AppRunner(app, handler_cancellation=True, access_log=None, **runner)
    await runner_.setup()
    try:
        await web.TCPSite(runner_, host, port).start()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await runner_.cleanup()
        raise
    bound_host, bound_port = runner_.addresses[0][:2]
    if ":" in bound_host:
        return runner_, f"http://[{bound_host}]:{bound_port}"
    return runner_, f"http://{bound_host}:{bound_port}"
