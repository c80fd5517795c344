"""The text stand-in's /v1/chat/completions answers as SGLang 0.5.23's captures do."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
import openai
import pytest

from miles_lite.testing import (
    ADD_TOOLS,
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    token_logprob,
)

from .test_text_engine import assert_shape, capture, post, wait_until

pytestmark = pytest.mark.anyio

TOOLS = ADD_TOOLS  # the stand-in scripts call this "add" tool
RULES = [
    TextRule(r"<tool_response>", "The sum is \\boxed{5}."),
    TextRule(
        r"What is 2\+3", '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    ),
    TextRule(r"Say stop", "one two STOP three"),
]
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture
async def engine(tokenizer: Any) -> AsyncIterator[TextStandInEngine]:
    config = TextStandInConfig(policy=TextPolicy(rules=RULES))
    async with TextStandInEngine(config, tokenizer) as engine:
        yield engine


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_ids_and_meta_info_have_the_captures_keys_and_types(
    engine: TextStandInEngine, http: aiohttp.ClientSession, captures: Path
) -> None:
    url = f"{engine.url}/v1/chat/completions"
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    _, ids = await post(
        http, url, {**body, "logprobs": True, "top_logprobs": 1, "return_token_ids": True}
    )
    _, meta = await post(http, url, {**body, "logprobs": True, "return_meta_info": True})
    _, plain = await post(http, url, {**body, "some_unknown_field": 1})
    assert_shape(ids, capture(captures, "chat_lp_ids.json"))
    real = capture(captures, "chat_meta_sglext_n2.json")
    del real["sglext"]  # SGLang's extension block, asked for with its own option
    real["choices"] = real["choices"][:1]
    assert_shape(meta, real)
    assert_shape(plain, capture(captures, "chat_unknown_field.txt"))
    choice = meta["choices"][0]
    triples = choice["meta_info"]["output_token_logprobs"]
    assert [lp for lp, _, _ in triples] == [
        token_logprob(i, t) for i, (_, t, _) in enumerate(triples)
    ]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [lp for lp, _, _ in triples]
    assert ids["model"] == "x" and ids["choices"][0]["finish_reason"] == "length"
    assert len(ids["choices"][0]["response_token_ids"]) == ids["usage"]["completion_tokens"] == 4


async def test_prompt_ids_are_the_real_qwen3_template(
    engine: TextStandInEngine, http: aiohttp.ClientSession, tokenizer: Any
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *QUESTION]
    status, answer = await post(
        http,
        f"{engine.url}/v1/chat/completions",
        {
            "messages": messages,
            "tools": TOOLS,
            "return_prompt_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert status == 200
    want = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    prompt = answer["choices"][0]["prompt_token_ids"]
    assert tokenizer.decode(prompt) == want
    assert want.endswith("<think>\n\n</think>\n\n") and '"name": "add"' in want
    assert answer["usage"]["prompt_tokens"] == len(prompt)


async def test_a_multi_turn_tool_call_through_the_openai_client(
    engine: TextStandInEngine,
) -> None:
    # Built in a thread: the client loads its TLS certificates when it is created.
    client = await anyio.to_thread.run_sync(
        lambda: openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="none")
    )
    async with client:
        first = await client.chat.completions.create(
            model="default",
            messages=QUESTION,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == ""
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "add"  # type: ignore[union-attr]
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}  # type: ignore[union-attr]
        history = [
            *QUESTION,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = await client.chat.completions.create(
            model="default",
            messages=history,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            extra_body={"return_token_ids": True},
        )
    final = second.choices[0]
    assert final.finish_reason == "stop" and final.message.content == "The sum is \\boxed{5}."
    assert not final.message.tool_calls
    extra = final.model_extra or {}
    assert extra["matched_stop"] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert "<tool_response>\n5\n</tool_response>" in engine.tokenizer.decode(
        extra["prompt_token_ids"]
    )


async def test_stop_strings_max_tokens_and_n(
    engine: TextStandInEngine, http: aiohttp.ClientSession
) -> None:
    url = f"{engine.url}/v1/chat/completions"
    messages = [{"role": "user", "content": "Say stop"}]
    _, stopped = await post(http, url, {"messages": messages, "stop": " STOP"})
    _, kept = await post(http, url, {"messages": messages, "stop": [" STOP"], "no_stop_trim": True})
    _, short = await post(http, url, {"messages": messages, "max_completion_tokens": 2})
    _, many = await post(http, url, {"messages": messages, "n": 2, "return_meta_info": True})
    assert stopped["choices"][0]["message"]["content"] == "one two"
    assert stopped["choices"][0]["matched_stop"] == " STOP"
    assert kept["choices"][0]["message"]["content"] == "one two STOP"
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 2
    ids = [c["meta_info"]["id"] for c in many["choices"]]
    assert len(many["choices"]) == 2 and len(set(ids)) == 2
    # Without logprobs, SGLang's meta_info has no log-prob triples either.
    assert "output_token_logprobs" not in many["choices"][0]["meta_info"]


async def test_id_options_with_stream_are_refused_in_sglangs_words(
    engine: TextStandInEngine, http: aiohttp.ClientSession, captures: Path
) -> None:
    url = f"{engine.url}/v1/chat/completions"
    status, answer = await post(
        http, url, {"messages": QUESTION, "stream": True, "return_prompt_token_ids": True}
    )
    assert status == 400
    assert answer == capture(captures, "chat_stream_prompt_ids_err.txt")
    for key in ("return_token_ids", "return_meta_info"):
        status, answer = await post(http, url, {"messages": QUESTION, "stream": True, key: True})
        assert status == 400 and key in answer["message"]
    for bad in (["not", "a", "map"], {"model": "x"}, {"messages": QUESTION, "max_tokens": "9"}):
        status, answer = await post(http, url, bad)
        assert status == 400 and answer["object"] == "error", bad
    assert engine.stats.running == 0


async def test_plain_streaming_has_the_captures_chunks(
    engine: TextStandInEngine, http: aiohttp.ClientSession, captures: Path
) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 3,
        "logprobs": True,
    }
    async with http.post(f"{engine.url}/v1/chat/completions", json=body) as resp:
        raw = await resp.text()
    real = (captures / "chat_stream.txt").read_text()

    def chunks(text: str) -> list[Any]:
        datas = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
        assert datas[-1] == "[DONE]"
        return [json.loads(d) for d in datas[:-1]]

    got, want = chunks(raw), chunks(real)
    assert len(got) == len(want)
    for mine, real in zip(got, want, strict=True):
        assert_shape(mine, real)
    assert got[-2]["choices"][0]["finish_reason"] == "length"


async def test_an_aborted_chat_request_answers_with_its_partial_output(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    config = TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(default_length=500))
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        answers: list[Any] = []

        async def chat() -> None:
            body = {
                "messages": [{"role": "user", "content": "write a lot"}],
                "rid": "session-7-turn-1",
                "logprobs": True,
                "return_meta_info": True,
            }
            answers.append((await post(http, f"{url}/v1/chat/completions", body))[1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(chat)
            await wait_until(lambda: engine.stats.generated_tokens >= 3)
            await post(http, f"{url}/abort_request", {"rid": "session-7"})
        assert engine.stats.running == 0
    choice = answers[0]["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["matched_stop"] is None
    assert choice["meta_info"]["id"] == "session-7-turn-1"
    assert 3 <= choice["meta_info"]["completion_tokens"] < 500
    assert (
        len(choice["meta_info"]["output_token_logprobs"])
        == choice["meta_info"]["completion_tokens"]
    )
