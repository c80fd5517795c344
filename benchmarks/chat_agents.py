"""The agents' HTTP clients of the text benchmark, shared by its miles_lite rows and its
miles rows (``miles_peer/agent_load.py``, run in miles' venv: so nothing from miles_lite
here, only aiohttp and openai)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

__all__ = ["Send", "chat_client"]

Send = Callable[[list[dict[str, Any]], int], Awaitable[tuple[str, int]]]


@asynccontextmanager
async def chat_client(kind: str) -> AsyncIterator[Callable[[str, str], Send]]:
    """One HTTP client shared by all agents (as a tuned user shares one); yields
    ``for_session(base_url, api_key) -> send(messages, max_tokens) -> (content, tokens)``.

    ``openai``: the real ``openai`` client, per agent a ``with_options`` copy sharing its
    connection pool; ``aiohttp``: a light agent posting the same JSON, so that the session
    server, not the client, is what is measured.
    """
    if kind == "openai":
        import openai

        base = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="-", max_retries=0)

        def for_openai(base_url: str, key: str) -> Send:
            client = base.with_options(base_url=base_url, api_key=key)

            async def send(messages: list[dict[str, Any]], max_tokens: int) -> tuple[str, int]:
                answer = await client.chat.completions.create(
                    model="default",
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=max_tokens,
                )
                tokens = answer.usage.completion_tokens if answer.usage else 0
                return str(answer.choices[0].message.content), tokens

            return send

        try:
            yield for_openai
        finally:
            await base.close()
        return
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        def for_aiohttp(base_url: str, key: str) -> Send:
            headers = {"Authorization": f"Bearer {key}"}

            async def send(messages: list[dict[str, Any]], max_tokens: int) -> tuple[str, int]:
                body = {"model": "default", "messages": messages, "max_tokens": max_tokens}
                async with http.post(
                    f"{base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        raise RuntimeError(f"chat turn failed: {resp.status} {answer}")
                content = answer["choices"][0]["message"]["content"]
                return str(content), int(answer["usage"]["completion_tokens"])

            return send

        yield for_aiohttp
