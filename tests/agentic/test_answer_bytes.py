"""What the agent gets of the engine's chat answer: what it asked for. The ids, log-probs
and ``meta_info`` the server asks the engine for (for the turn's record) stay out of the
answer unless the agent asked for them too (``logprobs``, ``return_prompt_token_ids``,
``return_meta_info``); an agent that asked for all of them gets the engine's own bytes:
decoded once to check and record them, never encoded again. An answer that is not
standard JSON (NaN literals) is encoded again, NaN as null."""

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


#: The agent's keys that ask for all the server asks the engine for.
ALL = {"logprobs": True, "return_prompt_token_ids": True, "return_meta_info": True}


async def turn_through(
    stack: OpenStack,
    rewrite: Callable[[dict[str, Any]], bytes] = lambda answer: json.dumps(answer).encode(),
    asked: dict[str, Any] | None = None,
    streamed: bool = False,
) -> tuple[bytes, bytes, int]:
    """One chat turn, its body with ``asked``, through the session server to a proxy in
    front of the stand-in engine that answers ``rewrite(answer)``: (the bytes the proxy
    answered, the bytes the agent got, the log-probs of the record kept)."""
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
                body.update(asked or {})
                headers = {"Authorization": f"Bearer {session.api_key}"}
                async with http.post(
                    f"{session.base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    assert resp.content_type == (
                        "text/event-stream" if streamed else "application/json"
                    )
                    got = await resp.read()
                (record,) = await s.server.close_session(session.id)
        finally:
            await runner.cleanup()
    assert len(answered) == 1
    return answered[0], got, len(record.output_log_probs)


async def test_the_agent_gets_the_engines_own_bytes(stack: OpenStack) -> None:
    # Indented, keys in another order, a float spelled 0.50: encoding it again would
    # give other bytes (compact, 0.5).
    def spelled(answer: dict[str, Any]) -> bytes:
        answer["spelled"] = 1.0
        text = json.dumps(answer, indent=1, sort_keys=True)
        return text.replace('"spelled": 1.0', '"spelled": 0.50e1').encode()

    sent, got, log_probs = await turn_through(stack, spelled, ALL)
    assert got == sent
    assert log_probs == 4  # "Hi there." and the end of turn, recorded


async def test_an_answer_with_nan_is_encoded_again(stack: OpenStack) -> None:
    def with_nan(answer: dict[str, Any]) -> bytes:
        answer["note"] = float("nan")
        return json.dumps(answer).encode()  # Python's json writes NaN

    sent, got, log_probs = await turn_through(stack, with_nan, ALL)
    assert b"NaN" in sent and b"NaN" not in got
    assert json.loads(got)["note"] is None
    assert json.loads(got)["choices"] == json.loads(sent)["choices"]
    assert log_probs == 4


def compact(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()  # as SGLang writes it


@pytest.mark.parametrize("rewrite", [compact, lambda answer: json.dumps(answer).encode()])
@pytest.mark.parametrize("asked", [{}, {"logprobs": False}, {"logprobs": True}, ALL])
async def test_the_agent_gets_what_it_asked_for(
    stack: OpenStack, asked: dict[str, Any], rewrite: Callable[[dict[str, Any]], bytes]
) -> None:
    sent, got, log_probs = await turn_through(stack, rewrite, asked=asked)
    engine, agent = json.loads(sent), json.loads(got)
    (choice,) = agent["choices"]
    (whole,) = engine["choices"]
    assert whole["logprobs"]["content"] and whole["prompt_token_ids"] and whole["meta_info"]
    for field, key in [
        ("logprobs", "logprobs"),
        ("prompt_token_ids", "return_prompt_token_ids"),
        ("meta_info", "return_meta_info"),
    ]:
        if asked.get(key) is True:
            assert choice[field] == whole[field]
        elif field == "logprobs":
            assert choice[field] is None  # OpenAI's shape: null when not asked for
        else:
            assert field not in choice
    rest = {
        k: v for k, v in choice.items() if k not in ("logprobs", "prompt_token_ids", "meta_info")
    }
    assert rest == {k: v for k, v in whole.items() if k in rest} and rest["message"]["content"]
    assert {k: v for k, v in agent.items() if k != "choices"} == {
        k: v for k, v in engine.items() if k != "choices"
    }
    assert log_probs == 4  # the record has them whatever the agent asked


async def test_a_streamed_answer_carries_the_log_probs_asked_for(stack: OpenStack) -> None:
    asked = {"logprobs": True, "stream": True}
    sent, got, log_probs = await turn_through(stack, compact, asked=asked, streamed=True)
    first, done = got.split(b"\n\n")[:2]
    chunk = json.loads(first.removeprefix(b"data: "))
    assert done == b"data: [DONE]" and chunk["object"] == "chat.completion.chunk"
    (choice,) = chunk["choices"]
    assert choice["logprobs"] == json.loads(sent)["choices"][0]["logprobs"]
    assert choice["logprobs"]["content"] and log_probs == 4
