"""The engine's chat answer reaches the agent as the engine's own bytes: decoded once to
check and record it, never encoded again (a whole answer of per-token log-probs); an
answer that is not standard JSON (NaN literals) is encoded again, NaN as null, as before."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.agentic.forwarding import CHAT_PATH

from .conftest import OpenStack

pytestmark = pytest.mark.anyio


async def turn_through(
    stack: OpenStack, rewrite: Callable[[dict[str, Any]], bytes]
) -> tuple[bytes, bytes, int]:
    """One chat turn through the session server to a proxy in front of the stand-in
    engine that answers ``rewrite(answer)``: (the bytes the proxy answered, the bytes the
    agent got, the records kept)."""
    answered: list[bytes] = []
    async with stack() as real, aiohttp.ClientSession() as http:
        target = real.engines[0].url

        async def chat(request: web.Request) -> web.Response:
            async with http.post(f"{target}{request.path}", json=await request.json()) as resp:
                answer = await resp.json()
            answered.append(rewrite(answer))
            return web.Response(body=answered[-1], content_type="application/json")

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post(CHAT_PATH, chat)
        app.router.add_get("/health", health)
        runner, url = await serve_app(app, "127.0.0.1", 0)
        try:
            async with stack(engines=0, before=[url]) as s:
                session = await s.server.open_session(s.run)
                body = {"model": "m", "messages": [{"role": "user", "content": "Say hi"}]}
                headers = {"Authorization": f"Bearer {session.api_key}"}
                async with http.post(
                    f"{session.base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    got = await resp.read()
                records = len(await s.server.close_session(session.id))
        finally:
            await runner.cleanup()
    assert len(answered) == 1
    return answered[0], got, records


async def test_the_agent_gets_the_engines_own_bytes(stack: OpenStack) -> None:
    # Indented, keys in another order, a float spelled 0.50: encoding it again would
    # give other bytes (compact, 0.5).
    def spelled(answer: dict[str, Any]) -> bytes:
        answer["spelled"] = 1.0
        text = json.dumps(answer, indent=1, sort_keys=True)
        return text.replace('"spelled": 1.0', '"spelled": 0.50e1').encode()

    sent, got, records = await turn_through(stack, spelled)
    assert got == sent
    assert records == 1


async def test_an_answer_with_nan_is_encoded_again(stack: OpenStack) -> None:
    def with_nan(answer: dict[str, Any]) -> bytes:
        answer["note"] = float("nan")
        return json.dumps(answer).encode()  # Python's json writes NaN

    sent, got, records = await turn_through(stack, with_nan)
    assert b"NaN" in sent and b"NaN" not in got
    assert json.loads(got)["note"] is None
    assert json.loads(got)["choices"] == json.loads(sent)["choices"]
    assert records == 1
