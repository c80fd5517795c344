"""Rollouts over scripted text stand-ins on loopback, for the driver's streaming and
staleness tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from tests.support.polling import wait_until

__all__ = ["OpenScripted", "wait_until"]


OpenScripted = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, TextStandInEngine]]]


@pytest.fixture
def scripted_rollout(tokenizer: Any) -> OpenScripted:
    """``async with scripted_rollout(answer_tokens, token_latency_s, **config) as (rollout,
    engine)``: one scripted stand-in answering ``answer_tokens`` random tokens and EOS,
    a text rollout over it."""

    @asynccontextmanager
    async def open_rollout(
        answer_tokens: int = 6, token_latency_s: float = 0.002, **config: Any
    ) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
        engine_config = TextStandInConfig(
            token_latency_s=token_latency_s, policy=TextPolicy(default_length=answer_tokens)
        )
        engine = TextStandInEngine(engine_config, tokenizer)
        await engine.__aenter__()
        try:
            settings = TextRolloutConfig(
                sampling=TextSamplingParams(max_new_tokens=answer_tokens + 1),
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=64),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
                **{
                    k: config.pop(k)
                    for k in list(config)
                    if k in TextRolloutConfig.__dataclass_fields__
                },
            )
            async with TextRollout.open(
                [engine.url], tokenizer=tokenizer, config=settings, **config
            ) as rollout:
                yield rollout, engine
        finally:
            with anyio.CancelScope(shield=True):
                await engine.aclose()

    return open_rollout
