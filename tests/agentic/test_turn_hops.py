"""What an agent turn costs the session server's loop, counted (never timed): one
worker-thread hop for a whole session of plain turns (the first token-in turn derives and
proves the template's glue), none for the turns after it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from miles_lite.agentic.server import SessionServer
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from tests.support.hop_counting import HopCountingContext
from tests.support.sessions import IN_PROCESS

from .conftest import RULES

pytestmark = pytest.mark.anyio


async def test_a_session_of_plain_turns_takes_one_hop(tokenizer: Any) -> None:
    turns = 6
    config = TextStandInConfig(policy=TextPolicy(rules=RULES))
    async with (
        TextStandInEngine(config, tokenizer) as engine,
        EngineClient(EngineClientConfig(total_timeout_s=30.0)) as client,
        Router([engine.url], client, RouterConfig(max_inflight_per_engine=4)) as router,
    ):
        context = HopCountingContext(
            tokenizer, router, TextSamplingParams(max_new_tokens=16), vocab_size=len(tokenizer)
        )
        async with SessionServer(context, IN_PROCESS) as server, aiohttp.ClientSession() as http:
            session = await server.open_session(RunContext(0))
            headers = {"Authorization": f"Bearer {session.api_key}"}
            messages: list[dict[str, Any]] = []
            for _ in range(turns):
                messages.append({"role": "user", "content": "Say hi"})
                body = {"model": "m", "messages": messages}
                async with http.post(
                    f"{session.base_url}/chat/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    answer = await resp.json()
                messages.append(answer["choices"][0]["message"])
            records = await server.close_session(session.id)
            stats = server.statistics()
    assert len(records) == turns
    assert (stats.templated_turns, stats.token_in_turns) == (1, turns - 1)
    # the first token-in turn renders (derive and prove) in one hop; the rest join the
    # proven glue and encode on the loop
    assert context.hops == 1
