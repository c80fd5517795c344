"""The rollout's sampling on chat turns: every key of SAMPLING_KEYS reaches chat turns
under its chat name, is text-only (accepted, not sent), or is refused when the rollout
opens; ``logit_bias`` reaches the engine on every turn and no agent overrides it; a
plain-HTTP agent may spread the openai-shaped ``request_kwargs`` (``extra_body``) into
its JSON body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.agentic.agent import AgentGenerate
from miles_lite.agentic.turns import BadTurn, engine_payload, merged_extra_body
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.errors import SamplingParamsError
from miles_lite.sglang.sampling import SAMPLING_KEYS, chat_sampling
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.types import SampleStatus
from tests.support.sessions import IN_PROCESS

from .conftest import RULES

pytestmark = pytest.mark.anyio

#: Where each /generate key goes on /v1/chat/completions: this test's own table (SGLang
#: 0.5.23's chat request, WIRE.md section 2), not the library's.
REACHES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "ignore_eos": "ignore_eos",
    "logit_bias": "logit_bias",
    "n": "n",
}
#: Text and streaming only: token ids and log-probs are the same without them.
TEXT_ONLY = {
    "skip_special_tokens",
    "no_stop_trim",
    "spaces_between_special_tokens",
    "stream_interval",
}
#: Change the tokens, and chat does not take them.
REFUSED = {
    "stop_regex",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
}
VALUES: dict[str, Any] = {"logit_bias": {"7": -100.0}, "stop": ["\n"], "n": 1, "regex": "a+"}


@pytest.mark.parametrize("key", SAMPLING_KEYS)
def test_each_sampling_key_reaches_chat_turns_or_is_refused_by_name(key: str) -> None:
    assert [key in REACHES, key in TEXT_ONLY, key in REFUSED].count(True) == 1
    value = VALUES.get(key, 3)
    if key in REACHES:
        assert chat_sampling({key: value}) == {REACHES[key]: value}
        sent = engine_payload(
            {"messages": [{"role": "user", "content": "hi"}]}, chat_sampling({key: value}), rid="r"
        )
        assert sent[REACHES[key]] == value
    elif key in TEXT_ONLY:
        assert chat_sampling({key: value}) == {}
    else:
        with pytest.raises(SamplingParamsError, match=repr(key)):
            chat_sampling({key: value})


def test_an_agents_logit_bias_never_overrides_the_rollouts() -> None:
    rollout = chat_sampling({"logit_bias": {"7": -100.0}, "max_new_tokens": 8})
    body = {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"7": 100.0}}
    assert engine_payload(body, rollout, rid="r")["logit_bias"] == {"7": -100.0}
    assert "logit_bias" not in engine_payload(body, {}, rid="r")  # dropped, never taken


def test_extra_body_is_merged_at_the_top_as_the_openai_client_sends_it() -> None:
    body = {"messages": [], "top_k": 1, "extra_body": {"top_k": 5, "min_p": 0.1}}
    assert merged_extra_body(body) == {"messages": [], "top_k": 5, "min_p": 0.1}
    assert merged_extra_body({"messages": [], "extra_body": None}) == {"messages": []}
    with pytest.raises(BadTurn) as caught:
        merged_extra_body({"messages": [], "extra_body": [1]})
    assert caught.value.param == "extra_body" and "list" in caught.value.message


@asynccontextmanager
async def agent_rollout(
    tokenizer: Any, agent: Any, sampling: TextSamplingParams
) -> AsyncIterator[tuple[TextRollout, TextStandInEngine]]:
    config = TextStandInConfig(policy=TextPolicy(rules=RULES))
    async with (
        TextStandInEngine(config, tokenizer) as engine,
        TextRollout.open(
            [engine.url],
            tokenizer=tokenizer,
            config=TextRolloutConfig(
                n_samples_per_prompt=2,
                sampling=sampling,
                engines=EngineConfig(
                    router=RouterConfig(max_inflight_per_engine=16),
                    client=EngineClientConfig(retry=RetryPolicy(max_attempts=1)),
                ),
            ),
            generate=AgentGenerate(agent, sessions=IN_PROCESS),
        ) as rollout,
    ):
        yield rollout, engine


async def plain_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> float:
    """A plain-HTTP agent that spreads the handed kwargs (extra_body nested) into its body."""
    body = {"model": "m", "messages": prompt, **request_kwargs}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base_url}/chat/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return 1.0 if answer["choices"][0]["message"]["content"] else 0.0


async def test_logit_bias_reaches_every_chat_turn_of_a_plain_http_agent(tokenizer: Any) -> None:
    sampling = TextSamplingParams(
        max_new_tokens=16, top_k=5, extra={"logit_bias": {"7": -100.0}, "min_p": 0.05}
    )
    async with agent_rollout(tokenizer, plain_agent, sampling) as (rollout, engine):
        result = await rollout.run([[{"role": "user", "content": "Say hi"}]])
        chat = [b for b in engine.statistics().requests if "messages" in b]
    assert [s.status for s in result.samples] == [SampleStatus.COMPLETED] * 2
    assert [s.reward for s in result.samples] == [1.0, 1.0]
    assert len(chat) == 2
    for body in chat:
        assert body["logit_bias"] == {"7": -100.0}
        assert (body["top_k"], body["min_p"], body["max_tokens"]) == (5, 0.05, 16)
        assert "extra_body" not in body


async def test_a_rollout_whose_sampling_chat_cannot_carry_is_refused_at_open(
    tokenizer: Any,
) -> None:
    sampling = TextSamplingParams(max_new_tokens=16, extra={"regex": "[a-z]+"})
    with pytest.raises(SamplingParamsError, match="'regex'"):
        async with agent_rollout(tokenizer, plain_agent, sampling):
            pytest.fail("opened")
