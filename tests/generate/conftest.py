"""Generate functions called directly over a loopback text stand-in (no rollout driver)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite.engine import EngineClient, EngineClientConfig, RetryPolicy, Router, RouterConfig
from miles_lite.generate.text_state import TextState
from miles_lite.testing import (
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
)

#: What the scripted model answers: tool calls for arithmetic, a boxed answer otherwise.
RULES = (
    TextRule(r"<tool_response>", "The sum is \\boxed{5}."),
    TextRule(
        r"add \d+ and \d+",
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    ),
    TextRule(r"slow tool", '<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>'),
    TextRule(r"broken tool", "<tool_call>\n{not json}\n</tool_call>"),
    TextRule(
        r"loop forever", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    ),
    TextRule(r"What is 2\+3", "It is \\boxed{5}."),
)


OpenState = Callable[..., AbstractAsyncContextManager[tuple[TextState, TextStandInEngine]]]


@pytest.fixture
def text_state(tokenizer: Any) -> OpenState:
    """``async with text_state(**TextState fields, engine=TextStandInConfig) as (state, engine)``:
    a TextState over a Router and EngineClient pointing at one stand-in on loopback."""

    @asynccontextmanager
    async def open_state(
        *, engine: TextStandInConfig | None = None, **state_fields: Any
    ) -> AsyncIterator[tuple[TextState, TextStandInEngine]]:
        config = engine or TextStandInConfig(policy=TextPolicy(rules=RULES))
        stand_in = TextStandInEngine(config, tokenizer)
        await stand_in.__aenter__()
        try:
            async with (
                EngineClient(EngineClientConfig(retry=RetryPolicy(max_attempts=1))) as client,
                Router([stand_in.url], client, RouterConfig(max_inflight_per_engine=8)) as router,
            ):
                yield TextState(tokenizer=tokenizer, router=router, **state_fields), stand_in
        finally:
            with anyio.CancelScope(shield=True):
                await stand_in.aclose()

    return open_state
