"""Session-server tests: a text stand-in engine on loopback, a router, a SessionServer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anthropic
import openai
import pytest

from miles_lite.agentic.server import SessionServer, SessionServerConfig
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.testing import ADD_TOOLS, TextPolicy, TextRule, TextStandInConfig, TextStandInEngine
from miles_lite.text.context import TextContext
from tests.support.sessions import IN_PROCESS
from tests.support.text_rules import TOOL_RULES

from .agents_plain import SSL_CONTEXT  # also warms openai up, off the loop

TOOLS = ADD_TOOLS  # the stand-in scripts call this "add" tool

RULES = (
    *TOOL_RULES,
    TextRule(r"Think first", "<think>\nLet me add.\n</think>\n\nIt is 5."),
    TextRule(r"And now\?", "Still 5."),
    TextRule(r"Say hi", "Hi there."),
    TextRule(r"Box it", "It is \\boxed{5}."),
)


@dataclass
class Stack:
    """Stand-in engines, their router, a session server over it, and a run its sessions
    are opened in."""

    engines: list[TextStandInEngine]
    router: Router
    run: RunContext
    server: SessionServer


OpenStack = Callable[..., AbstractAsyncContextManager[Stack]]


@pytest.fixture
def stack(tokenizer: Any) -> OpenStack:
    """``async with stack(engines=1, engine_config=..., server_config=...) as s``
    (``tokenizer=``: another tokenizer or chat template for engines and server;
    ``before``: URLs of other engines, first in the router's list). The server is served
    in the test's process unless ``server_config`` says otherwise (:data:`IN_PROCESS`)."""

    @asynccontextmanager
    async def open_stack(
        *,
        engines: int = 1,
        engine_config: TextStandInConfig | None = None,
        server_config: SessionServerConfig | None = None,
        max_new_tokens: int = 64,
        tokenizer: Any = tokenizer,
        before: Sequence[str] = (),
        router_config: RouterConfig | None = None,
    ) -> AsyncIterator[Stack]:
        config = engine_config or TextStandInConfig(policy=TextPolicy(rules=RULES))
        opened: list[TextStandInEngine] = []
        try:
            for _ in range(engines):
                engine = TextStandInEngine(config, tokenizer)
                await engine.__aenter__()
                opened.append(engine)
            client_config = EngineClientConfig(total_timeout_s=30.0)
            async with (
                EngineClient(client_config) as client,
                Router(
                    [*before, *(e.url for e in opened)],
                    client,
                    router_config or RouterConfig(max_inflight_per_engine=4),
                ) as router,
            ):
                context = TextContext(
                    tokenizer,
                    router,
                    TextSamplingParams(max_new_tokens=max_new_tokens),
                    vocab_size=len(tokenizer),
                )
                async with SessionServer(context, server_config or IN_PROCESS) as server:
                    yield Stack(engines=opened, router=router, run=RunContext(0), server=server)
        finally:
            for engine in opened:
                await engine.aclose()

    return open_stack


Clients = Callable[..., openai.AsyncOpenAI]
Claudes = Callable[[str, str], anthropic.AsyncAnthropic]
C = TypeVar("C", openai.AsyncOpenAI, anthropic.AsyncAnthropic)


@asynccontextmanager
async def closed_after(make: Callable[..., C]) -> AsyncIterator[Callable[..., C]]:
    """``make``, with every client it made closed when the block ends."""
    made: list[C] = []

    def tracked(*args: Any, **kwargs: Any) -> C:
        made.append(make(*args, **kwargs))
        return made[-1]

    try:
        yield tracked
    finally:
        for client in made:
            await client.close()


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    """``clients(base_url, api_key)``: real openai clients, all closed after the test."""

    def make(base_url: str, api_key: str = "unused") -> openai.AsyncOpenAI:
        http_client = openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT)
        return openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=30, http_client=http_client
        )

    async with closed_after(make) as tracked:
        yield tracked


@pytest.fixture
async def claude() -> AsyncIterator[Claudes]:
    """``claude(base_url, api_key)``: real anthropic clients, all closed after the test."""

    def make(base_url: str, api_key: str) -> anthropic.AsyncAnthropic:
        http_client = anthropic.DefaultAsyncHttpxClient(verify=SSL_CONTEXT)
        return anthropic.AsyncAnthropic(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=30, http_client=http_client
        )

    async with closed_after(make) as tracked:
        yield tracked
