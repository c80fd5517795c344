"""Text rollouts over a scripted stand-in on loopback, for the trainer's side: streaming,
staleness, and the journal (:func:`scripted_rollout`; :func:`journaled` is the same with
a journal and a reward)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.testing import TextPolicy, TextRule, TextStandInConfig, TextStandInEngine

__all__ = ["Journaled", "OpenScripted", "Parity"]

OpenScripted = Callable[..., AbstractAsyncContextManager[tuple[TextRollout, TextStandInEngine]]]
Journaled = OpenScripted


class Parity:
    """A reward: the share of even ids in the response (an async scorer on the loop)."""

    async def score(self, samples: list[Any]) -> list[float]:
        out = []
        for s in samples:
            response = s.tokens[len(s.tokens) - s.response_length :]
            out.append(sum(t % 2 == 0 for t in response) / max(1, len(response)))
        return out


@pytest.fixture
def scripted_rollout(tokenizer: Any) -> OpenScripted:
    """``async with scripted_rollout(answer_tokens, token_latency_s, rules=(), **config) as
    (rollout, engine)``: a fresh scripted stand-in answering ``answer_tokens`` random tokens
    and EOS (a prompt one of ``rules`` matches: its answer), and a text rollout over it. ``config``: fields of :class:`TextRolloutConfig`,
    the rest goes to :meth:`TextRollout.open` (``journal``, ``rewards``, ...)."""

    @asynccontextmanager
    async def open_rollout(
        answer_tokens: int = 6,
        token_latency_s: float = 0.002,
        rules: Sequence[TextRule] = (),
        **config: Any,
    ) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
        engine_config = TextStandInConfig(
            token_latency_s=token_latency_s,
            policy=TextPolicy(rules=rules, default_length=answer_tokens),
        )
        engine = TextStandInEngine(engine_config, tokenizer)
        await engine.__aenter__()
        try:
            fields = TextRolloutConfig.__dataclass_fields__
            settings = TextRolloutConfig(
                sampling=TextSamplingParams(max_new_tokens=answer_tokens + 1),
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=64),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
                **{k: config.pop(k) for k in list(config) if k in fields},
            )
            async with TextRollout.open(
                [engine.url], tokenizer=tokenizer, config=settings, **config
            ) as rollout:
                yield rollout, engine
        finally:
            with anyio.CancelScope(shield=True):
                await engine.aclose()

    return open_rollout


@pytest.fixture
def journaled(scripted_rollout: OpenScripted) -> Journaled:
    """``async with journaled(path, answer_tokens=6, token_latency_s=0.002, **config) as
    (rollout, engine)``: :func:`scripted_rollout`, journaled at ``path`` (a path or a
    Journal), two samples a prompt (unless ``config`` says), rewarded by :class:`Parity`."""

    def open_rollout(
        journal: Any, answer_tokens: int = 6, token_latency_s: float = 0.002, **config: Any
    ) -> AbstractAsyncContextManager[tuple[TextRollout, TextStandInEngine]]:
        config.setdefault("n_samples_per_prompt", 2)
        return scripted_rollout(
            answer_tokens,
            token_latency_s,
            reward="parity",
            rewards={"parity": Parity()},
            journal=journal,
            **config,
        )

    return open_rollout
