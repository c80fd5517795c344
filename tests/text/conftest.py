"""Text generate functions and rollouts over the text stand-in engine on loopback, with the
real Qwen3 tokenizer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.testing import TextPolicy, TextRule, TextStandInConfig, TextStandInEngine
from miles_lite.text.context import TextContext
from miles_lite.types import Sample
from tests.support.text_rules import TOOL_RULES

#: What the scripted model answers: tool calls for arithmetic, a boxed answer otherwise.
RULES = (
    *TOOL_RULES,
    TextRule(r"slow tool", '<tool_call>\n{"name": "slow", "arguments": {}}\n</tool_call>'),
    TextRule(r"broken tool", "<tool_call>\n{not json}\n</tool_call>"),
    TextRule(
        r"loop forever", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    ),
    TextRule(r"What is 2\+3", "It is \\boxed{5}."),
)


@dataclass
class Direct:
    """A text context over one stand-in and a run in it, to call generate functions
    directly (no rollout driver)."""

    context: TextContext
    run: RunContext

    def input(self, sample: Sample, **params: Any) -> GenerateFnInput[TextContext]:
        """The input of one call on ``sample``, the default sampling updated by ``params``."""
        return GenerateFnInput(
            samples=[sample],
            sampling_params={**self.context.sampling_params(), **params},
            context=self.context,
            run=self.run,
        )

    def new_run(self) -> None:
        """A new run (the last one stopped)."""
        self.run = RunContext(self.run.rollout_id + 1)


OpenState = Callable[..., AbstractAsyncContextManager[tuple[Direct, TextStandInEngine]]]


@pytest.fixture
def text_state(tokenizer: Any) -> OpenState:
    """``async with text_state(**TextContext fields, engine=TextStandInConfig,
    max_inflight_per_engine=8, client=EngineClientConfig) as (direct, engine)``: a
    :class:`Direct` over a Router and EngineClient pointing at one stand-in on loopback."""

    @asynccontextmanager
    async def open_state(
        *,
        engine: TextStandInConfig | None = None,
        max_inflight_per_engine: int = 8,
        client: EngineClientConfig | None = None,
        **context_fields: Any,
    ) -> AsyncIterator[tuple[Direct, TextStandInEngine]]:
        config = engine or TextStandInConfig(policy=TextPolicy(rules=RULES))
        stand_in = TextStandInEngine(config, tokenizer)
        await stand_in.__aenter__()
        try:
            async with (
                EngineClient(
                    client or EngineClientConfig(retry=RetryPolicy(max_attempts=1))
                ) as engine_client,
                Router(
                    [stand_in.url],
                    engine_client,
                    RouterConfig(max_inflight_per_engine=max_inflight_per_engine),
                ) as router,
            ):
                context = TextContext(tokenizer=tokenizer, router=router, **context_fields)
                yield Direct(context, RunContext(0)), stand_in
        finally:
            with anyio.CancelScope(shield=True):
                await stand_in.aclose()

    return open_state


OpenRollout = Callable[..., AbstractAsyncContextManager[TextRollout]]


@pytest.fixture
def text_rollout(tokenizer: Any) -> OpenRollout:
    """``async with text_rollout(engines=1, **config) as (rollout, engines)``."""

    @asynccontextmanager
    async def open_rollout(
        *,
        engines: int = 1,
        engine_config: TextStandInConfig | None = None,
        max_inflight_per_engine: int = 64,
        max_new_tokens: int = 32,
        **kwargs: Any,
    ) -> AsyncIterator[Any]:
        engine_config = engine_config or TextStandInConfig(policy=TextPolicy(rules=RULES))
        config_fields = set(TextRolloutConfig.__dataclass_fields__)
        config = TextRolloutConfig(
            sampling=kwargs.pop("sampling", TextSamplingParams(max_new_tokens=max_new_tokens)),
            engines=EngineConfig(
                router=RouterConfig(max_inflight_per_engine=max_inflight_per_engine),
                client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
            ),
            **{k: kwargs.pop(k) for k in list(kwargs) if k in config_fields},
        )
        async with (
            _engines(engines, engine_config, tokenizer) as running,
            TextRollout.open(
                [e.url for e in running],
                tokenizer=tokenizer,
                config=config,
                **kwargs,
            ) as rollout,
        ):
            yield rollout, running

    return open_rollout


@asynccontextmanager
async def _engines(
    n: int, config: TextStandInConfig, tokenizer: Any
) -> AsyncIterator[list[TextStandInEngine]]:
    engines = [TextStandInEngine(config, tokenizer) for _ in range(n)]
    try:
        for engine in engines:
            await engine.__aenter__()
        yield engines
    finally:
        with anyio.CancelScope(shield=True):
            for engine in engines:
                await engine.aclose()
