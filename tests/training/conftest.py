"""Journaled text rollouts over a scripted stand-in on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine

__all__ = ["Journaled", "Parity"]

Journaled = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, TextStandInEngine]]]


class Parity:
    """A reward: the share of even ids in the response (an async scorer on the loop)."""

    async def score(self, samples: list[Any]) -> list[float]:
        out = []
        for s in samples:
            response = s.tokens[len(s.tokens) - s.response_length :]
            out.append(sum(t % 2 == 0 for t in response) / max(1, len(response)))
        return out


@pytest.fixture
def journaled(tokenizer: Any) -> Journaled:
    """``async with journaled(path, answer_tokens=6, token_latency_s=0.002, **config) as
    (rollout, engine)``: a fresh scripted stand-in and a text rollout over it, journaled
    at ``path`` (a path or a Journal), rewarded by :class:`Parity`."""

    @asynccontextmanager
    async def open_rollout(
        journal: Any, answer_tokens: int = 6, token_latency_s: float = 0.002, **config: Any
    ) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
        engine_config = TextStandInConfig(
            token_latency_s=token_latency_s, policy=TextPolicy(default_length=answer_tokens)
        )
        engine = TextStandInEngine(engine_config, tokenizer)
        await engine.__aenter__()
        try:
            config.setdefault("n_samples_per_prompt", 2)
            settings = TextRolloutConfig(
                sampling=TextSamplingParams(max_new_tokens=answer_tokens + 1),
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=64),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
                reward="parity",
                **config,
            )
            async with TextRollout.open(
                [engine.url],
                tokenizer=tokenizer,
                config=settings,
                rewards={"parity": Parity()},
                journal=journal,
            ) as rollout:
                yield rollout, engine
        finally:
            with anyio.CancelScope(shield=True):
                await engine.aclose()

    return open_rollout
