"""An agent module without an ``abort`` hook, and one whose agent raises."""

from __future__ import annotations

import ssl
from typing import Any

import openai

#: Made once at import: a new client would otherwise load the CA bundle on the event loop
#: (50-400 ms, which the loop-block detector rightly fails).
SSL_CONTEXT = ssl.create_default_context()


def _warm_up() -> None:
    """Pay openai's lazy imports and pydantic schema builds at import, not on the loop."""
    with openai.OpenAI(base_url="http://127.0.0.1:9", api_key="-") as client:
        _ = client.chat.completions, client.models
    openai.types.chat.ChatCompletion.model_rebuild(force=True)
    openai.types.chat.ChatCompletionChunk.model_rebuild(force=True)


_warm_up()


def chat_client(base_url: str) -> openai.AsyncOpenAI:
    """An async OpenAI client for an agent, cheap to make inside the event loop."""
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key="-",
        max_retries=0,
        timeout=30,
        http_client=openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT),
    )


async def run_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """One chat turn; no reward (the rollout's reward pool scores it)."""
    async with chat_client(base_url) as oa:
        await oa.chat.completions.create(model="m", messages=prompt, **request_kwargs)  # type: ignore[arg-type]
    return None


async def failing_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """One turn, then a bug."""
    await run_agent(base_url, prompt, request_kwargs)
    raise KeyError("the agent's own bug")


async def picky_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """Sends a sampling value the engine refuses when the prompt says 'bad'."""
    extra = {"seed": "many"} if "bad" in str(prompt) else {}
    async with chat_client(base_url) as oa:
        await oa.chat.completions.create(
            model="m",
            messages=prompt,  # type: ignore[arg-type]
            max_tokens=8,
            extra_body=extra,
        )
    return 1.0


def sync_agent(base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]) -> Any:
    """A synchronous agent (a blocking OpenAI client): it runs in a worker thread."""
    with openai.OpenAI(base_url=base_url, api_key="-", max_retries=0, timeout=30) as oa:
        answer = oa.chat.completions.create(model="m", messages=prompt, **request_kwargs)  # type: ignore[arg-type]
    return {"metadata": {"finish": answer.choices[0].finish_reason}}


async def two_user_turns(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """Ask, then ask again: the Qwen3 template drops the first answer's <think> block."""
    async with chat_client(base_url) as oa:
        messages = list(prompt)
        first = await oa.chat.completions.create(model="m", messages=messages, **request_kwargs)  # type: ignore[arg-type]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "And now?"})
        await oa.chat.completions.create(model="m", messages=messages, **request_kwargs)  # type: ignore[arg-type]
    return 1.0
