"""Text rollouts over tiny-model stand-ins whose fleet changes under them: engines that
fail an update, join, leave, die and come back (issue 33)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.testing import TextStandInConfig, TextStandInEngine, TinyModelPolicy
from tests.support.outcomes import check_exactly_once, check_none_failed

__all__ = [
    "FAST_ROUTER",
    "OpenFleet",
    "check_exactly_once",
    "check_none_failed",
    "no_rid_reached_two",
    "rids_at",
    "stand_in",
]

#: Probes every 50 ms; one failed probe or request takes an engine out; back at once.
FAST_ROUTER = RouterConfig(
    max_inflight_per_engine=8,
    health_interval_s=0.05,
    health_timeout_s=0.5,
    failure_threshold=1,
    readmit_cooldown_s=0.05,
    wait_timeout_s=20.0,
)

LONG = TextSamplingParams(max_new_tokens=12, extra={"ignore_eos": True})

OpenFleet = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, list[TextStandInEngine]]]]


def stand_in(
    tokenizer: Any, policy: TinyModelPolicy | None = None, **config: Any
) -> TextStandInEngine:
    """A tiny-model stand-in (10 ms a token unless told)."""
    config.setdefault("token_latency_s", 0.01)
    return TextStandInEngine(
        TextStandInConfig(policy=policy or TinyModelPolicy(seed=0), **config), tokenizer
    )


@pytest.fixture
def fleet_rollout(tokenizer: Any) -> OpenFleet:
    """``async with fleet_rollout(*policies, router=..., **config) as (rollout, engines)``:
    one started stand-in per policy, a text rollout over them (FAST_ROUTER, one try)."""

    @asynccontextmanager
    async def open_rollout(
        *policies: TinyModelPolicy, router: RouterConfig = FAST_ROUTER, **config: Any
    ) -> AsyncIterator[tuple[TextRollout, list[TextStandInEngine]]]:
        engines = [stand_in(tokenizer, p) for p in policies or (TinyModelPolicy(seed=0),)]
        try:
            for engine in engines:
                await engine.__aenter__()
            config.setdefault("sampling", LONG)
            settings = TextRolloutConfig(
                engines=EngineConfig(
                    router=router,
                    client=EngineClientConfig(
                        retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01),
                        read_timeout_s=config.pop("read_timeout_s", 30.0),
                    ),
                ),
                **config,
            )
            urls = [e.url for e in engines]
            async with TextRollout.open(urls, tokenizer=tokenizer, config=settings) as rollout:
                yield rollout, engines
        finally:
            with anyio.CancelScope(shield=True):
                for engine in engines:
                    await engine.aclose()

    return open_rollout


def rids_at(*engines: TextStandInEngine) -> list[set[str]]:
    """The rids each engine received."""
    return [{str(body.get("rid")) for body in e.statistics().requests} for e in engines]


def no_rid_reached_two(*engines: TextStandInEngine) -> None:
    """No rid reached two engines (a generation is never sent twice)."""
    seen = rids_at(*engines)
    for i, a in enumerate(seen):
        for b in seen[i + 1 :]:
            assert not a & b
