"""The text stand-in engine answers in SGLang 0.5.23's shape, key for key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite.testing import (
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    shape_diff,
    token_logprob,
    wire_shape,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def shape(value: Any) -> Any:
    """Keys and types, recursively: what two answers must share (values may differ)."""
    return wire_shape(value)


def assert_shape(got: Any, want: Any) -> None:
    """``got`` has ``want``'s keys (in order) and types, recursively; else a readable diff."""
    diff = shape_diff(got, want)
    assert not diff, "answer differs from the capture:\n" + "\n".join(diff)


def capture(captures: Path, name: str) -> Any:
    return json.loads((captures / name).read_text().split("\n[")[0])


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        text = await resp.text()
        return resp.status, (json.loads(text) if text else None)


async def test_answers_have_the_captures_keys_and_types(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        status, answer = await post(
            http,
            f"{engine.url}/generate",
            {
                "input_ids": [1, 308, 202, 330],
                "sampling_params": {"max_new_tokens": 4},
                "return_logprob": True,
                "return_prompt_token_ids": True,
            },
        )
    assert status == 200
    real = capture(captures, "gen_input_ids_prompt_lp.json")
    real["meta_info"]["input_token_logprobs"] = []  # we never ask for prompt log-probs
    assert_shape(answer, real)
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    lps = answer["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == answer["output_ids"]
    assert [lp for lp, _, _ in lps] == [
        token_logprob(i, t) for i, t in enumerate(answer["output_ids"])
    ]


async def test_an_unknown_sampling_key_is_refused_in_sglangs_words(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        status, answer = await post(
            http, f"{engine.url}/generate", {"text": "hi", "sampling_params": {"bogus_key": 1}}
        )
    assert status == 400
    assert answer == capture(captures, "gen_bad_sampling_key.txt")


async def test_stop_strings_and_eos_with_and_without_trim(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    policy = TextPolicy(rules=[TextRule("question", "The answer is 42. END more")])
    async with TextStandInEngine(TextStandInConfig(policy=policy), tokenizer) as engine:
        url = f"{engine.url}/generate"
        base = {"text": "a question", "return_logprob": True}
        _, trimmed = await post(http, url, {**base, "sampling_params": {"stop": [" END"]}})
        _, kept = await post(
            http, url, {**base, "sampling_params": {"stop": [" END"], "no_stop_trim": True}}
        )
        _, eos = await post(http, url, {**base, "sampling_params": {}})
    assert trimmed["text"] == "The answer is 42."
    assert kept["text"].endswith(" END")
    for answer in (trimmed, kept):
        meta = answer["meta_info"]
        assert meta["finish_reason"] == {"type": "stop", "matched": " END"}
        assert len(answer["output_ids"]) == meta["completion_tokens"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": im_end}
    assert eos["output_ids"][-1] == im_end and eos["text"] == "The answer is 42. END more"


async def test_abort_by_rid_prefix_returns_partial_output_and_loads_go_idle(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    config = TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(default_length=1000))
    async with TextStandInEngine(config, tokenizer) as engine:
        answers: dict[str, Any] = {}

        async def generate(rid: str) -> None:
            body = {"text": "x", "rid": rid, "sampling_params": {"max_new_tokens": 500}}
            answers[rid] = (await post(http, f"{engine.url}/generate", body))[1]

        async with anyio.create_task_group() as tg:
            tg.start_soon(generate, "job10")
            tg.start_soon(generate, "other")
            await wait_until(
                lambda: engine.stats.running == 2 and engine.stats.generated_tokens >= 4
            )
            _, loads = await post_get(http, f"{engine.url}/v1/loads")
            assert loads["loads"][0]["num_running_reqs"] == 2
            await anyio.sleep(0.05)
            await post(http, f"{engine.url}/abort_request", {"rid": "job1"})  # a prefix
            await anyio.sleep(0.05)
            await post(http, f"{engine.url}/abort_request", {"abort_all": True})
        _, loads = await post_get(http, f"{engine.url}/v1/loads")
    assert_shape(answers["job10"], capture(captures, "abort_victim.json"))
    for rid in ("job10", "other"):
        meta = answers[rid]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and meta["id"] == rid
        assert 0 < meta["completion_tokens"] < 500
    assert loads["loads"][0]["num_running_reqs"] == loads["loads"][0]["num_waiting_reqs"] == 0


async def post_get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def test_weight_version_updates_show_in_later_answers(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        status, answer = await post(
            http, f"{engine.url}/update_weight_version", {"new_version": "step-7"}
        )
        _, generated = await post(
            http, f"{engine.url}/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}
        )
    assert status == 200
    assert answer == json.loads(
        (captures / "update_weight_version.txt").read_text()[: -len("[200]")]
    )
    assert generated["meta_info"]["weight_version"] == "step-7"
    assert generated["meta_info"]["weight_versions"] == [
        {"version": "step-7", "start": 0, "end": 2}
    ]


async def test_n_above_one_replaces_rids_and_batches_answer_lists(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        _, many = await post(
            http,
            f"{engine.url}/generate",
            {"text": "x", "rid": "mine", "sampling_params": {"n": 2, "max_new_tokens": 2}},
        )
        _, batch = await post(
            http,
            f"{engine.url}/generate",
            {"input_ids": [[1, 2], [3, 4]], "sampling_params": {"max_new_tokens": 2}},
        )
        status, _ = await post(http, f"{engine.url}/generate", ["not", "an", "object"])
    assert len(many) == 2 and all(a["meta_info"]["id"] != "mine" for a in many)
    assert len(batch) == 2 and status == 400


async def test_streaming_ends_with_the_finish_reason_and_done(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 3}}
        async with http.post(f"{engine.url}/generate", json=body) as resp:
            raw = await resp.text()
    chunks = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    last = json.loads(chunks[-2])
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert all(json.loads(c)["meta_info"]["finish_reason"] is None for c in chunks[:-2])


@pytest.mark.parametrize(
    ("name", "body"),
    [
        (
            "gen_batch.json",
            {
                "input_ids": [[1, 2], [3, 4, 5, 6, 7, 8]],
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3},
            },
        ),
        (
            "gen_n2.json",
            {
                "text": "hi",
                "return_logprob": True,
                "sampling_params": {"n": 2, "max_new_tokens": 3},
            },
        ),
        (
            "gen_stop.json",
            {
                "text": "hi",
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3, "stop": ["never-seen"]},
            },
        ),
        (
            "gen_unknown_top_field.txt",
            {"text": "hi", "unknown_top_field": 1, "sampling_params": {"max_new_tokens": 3}},
        ),
    ],
)
async def test_each_generate_capture_has_the_same_keys_and_types(
    name: str, body: dict[str, Any], tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        status, answer = await post(http, f"{engine.url}/generate", body)
    assert status == 200
    real = capture(captures, name)
    assert isinstance(answer, list) == isinstance(real, list)
    if isinstance(real, list):
        assert len(answer) == len(real)
    assert_shape(answer, real)


def test_shape_diff_names_each_difference() -> None:
    real = {"a": 1, "b": [{"c": "x"}], "cached_tokens_details": {"device": 1}}
    assert shape_diff({"a": 2.5, "b": [{"c": "y"}], "cached_tokens_details": None}, real) == []
    diff = shape_diff({"a": "1", "b": [{"d": "x"}], "e": None}, real)
    assert diff == [
        "$.cached_tokens_details: missing",
        "$.e: not in the reference answer",
        "$.a: str != the reference's number",
        "$.b[0].c: missing",
        "$.b[0].d: not in the reference answer",
    ]
    assert shape_diff({"b": 1, "a": 1}, {"a": 1, "b": 2}) == [
        "$: key order ['b', 'a'] != ['a', 'b']"
    ]
