"""The text stand-in's control endpoints, sampling edge cases, streaming aborts and process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite.testing import (
    TextEngineProcess,
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    token_logprob,
)

from .test_text_engine import assert_shape, post, post_get, wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def sse(raw: str) -> list[Any]:
    datas = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


async def test_control_endpoints_answer_as_the_captures(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        url = engine.url
        for path in ("/health", "/health_generate"):
            async with http.get(f"{url}{path}") as resp:
                assert resp.status == 200 and await resp.read() == b""
        _, models = await post_get(http, f"{url}/v1/models")
        assert_shape(models, json.loads((captures / "v1_models.json").read_text()))
        _, info = await post_get(http, f"{url}/model_info")
        assert info["is_generation"] is True and info["weight_version"] == "default"
        _, server = await post_get(http, f"{url}/server_info")
        assert server["version"] == "0.5.23" and server["max_running_requests"] == 64
        async with http.post(f"{url}/flush_cache") as resp:
            flushed = await resp.text()
        assert flushed == (captures / "flush_cache.txt").read_text().rsplit("[200]", 1)[0]
        status, paused = await post(http, f"{url}/pause_generation", {"mode": "in_place"})
        assert status == 200 and paused == capture_text(captures, "pause.txt")
        assert engine.statistics().paused
        status, resumed = await post(http, f"{url}/continue_generation", {})
        assert status == 200 and resumed == capture_text(captures, "continue.txt")
        status, _ = await post(http, f"{url}/pause_generation", {"mode": "sideways"})
        assert status == 400
        status, _ = await post(http, f"{url}/update_weight_version", {"new_version": 7})
        assert status == 400
        status, loads = await post_get(http, f"{url}/v1/loads?include=core")
        assert status == 200 and set(loads) == {
            "timestamp",
            "version",
            "accelerator",
            "num_accelerators",
            "loads",
        }
        assert "queues" not in loads["loads"][0] and loads["loads"][0]["max_running_requests"] == 64
        async with http.get(f"{url}/v1/loads?include=bogus") as resp:
            assert resp.status == 400


def capture_text(captures: Path, name: str) -> Any:
    return json.loads((captures / name).read_text().rsplit("[", 1)[0])


async def test_pause_in_place_holds_running_requests_until_continue(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    config = TextStandInConfig(token_latency_s=0.005)
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        answers: list[Any] = []

        async def generate() -> None:
            body = {"text": "x", "sampling_params": {"max_new_tokens": 10, "ignore_eos": True}}
            answers.append((await post(http, f"{url}/generate", body))[1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(generate)
            await wait_until(lambda: engine.stats.generated_tokens >= 2)
            await post(http, f"{url}/pause_generation", {"mode": "in_place"})
            held = engine.stats.generated_tokens
            await anyio.sleep(0.1)
            assert engine.stats.generated_tokens <= held + 1 and not answers
            await post(http, f"{url}/continue_generation", {})
    assert answers[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 10}


async def test_sampling_edge_cases(tokenizer: Any, http: aiohttp.ClientSession) -> None:
    policy = TextPolicy(rules=[TextRule("short", "Yes.")])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    async with TextStandInEngine(TextStandInConfig(policy=policy), tokenizer) as engine:
        url = f"{engine.url}/generate"

        async def gen(params: dict[str, Any], **extra: Any) -> Any:
            status, answer = await post(
                http, url, {"text": "short", "sampling_params": params, **extra}
            )
            assert status == 200, answer
            return answer

        plain = await gen({})
        assert plain["text"] == "Yes." and plain["output_ids"][-1] == im_end
        longer = await gen({"min_new_tokens": 6, "max_new_tokens": 8})
        assert len(longer["output_ids"]) >= 6 and im_end not in longer["output_ids"][:6]
        ignored = await gen({"ignore_eos": True, "max_new_tokens": 7})
        assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
        first = plain["output_ids"][0]
        by_id = await gen({"stop_token_ids": [first]}, return_logprob=True)
        assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
        assert by_id["output_ids"] == [first]
        lps = await gen({}, return_logprob=True, return_text_in_logprobs=True, logprob_start_len=0)
        meta = lps["meta_info"]
        assert meta["output_token_logprobs"][0][2] == tokenizer.decode([first])
        prompt = tokenizer.encode("short", add_special_tokens=False)
        assert [t for _, t, _ in meta["input_token_logprobs"]] == prompt
        assert meta["input_token_logprobs"][0][0] is None
        assert meta["output_token_logprobs"][0][0] == token_logprob(0, first)
        for bad in (
            {"max_new_tokens": True},
            {"max_new_tokens": 1.5},
            {"ignore_eos": 1},
            {"temperature": "hot"},
            {"stop": 3},
            {"stop_token_ids": ["x"]},
        ):
            status, answer = await post(http, url, {"text": "x", "sampling_params": bad})
            assert status == 400 and "invalid type" in answer["error"], bad
        for bad_body in ({"sampling_params": {}}, {"input_ids": []}, {"text": "x", "rid": 5}):
            status, _ = await post(http, url, bad_body)
            assert status == 400, bad_body
        async with http.post(url, data=b"{not json") as resp:
            assert resp.status == 400
        status, batch = await post(
            http, url, {"text": ["a", "b"], "rid": ["r-a", "r-b"], "sampling_params": {}}
        )
        assert [a["meta_info"]["id"] for a in batch] == ["r-a", "r-b"]
    stats = engine.statistics()
    assert {"r-a", "r-b"} <= set(stats.rids_seen) and stats.running == stats.waiting == 0
    with pytest.raises(ValueError, match="max_running"):
        TextStandInConfig(max_running=0)


async def test_stream_chunks_match_the_capture_and_an_abort_ends_a_stream(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    config = TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(default_length=1000))
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        body = {
            "text": "x",
            "stream": True,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 3},
        }
        async with http.post(f"{url}/generate", json=body) as resp:
            chunks = sse(await resp.text())
        real = sse((captures / "gen_stream.txt").read_text())
        assert_shape(chunks[0], real[0])
        assert_shape(chunks[-1], real[-1])
        assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3]
        assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}

        streamed: list[Any] = []

        async def victim() -> None:
            body = {"text": "x", "rid": "long-2", "stream": True, "sampling_params": {}}
            async with http.post(f"{url}/generate", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        streamed.append(json.loads(line[len(b"data: ") :]))  # noqa: PERF401

        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await wait_until(lambda: len(streamed) >= 3)
            await post(http, f"{url}/abort_request", {"rid": "long"})
    last = streamed[-1]
    real_last = sse((captures / "abort_victim_stream.txt").read_text())[-1]
    assert_shape(last, real_last)
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert 3 <= last["meta_info"]["completion_tokens"] < 128


async def test_waiting_requests_count_in_loads_and_abort_while_waiting(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    config = TextStandInConfig(token_latency_s=0.01, max_running=1)
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        answers: dict[str, Any] = {}

        async def generate(rid: str) -> None:
            body = {"text": "x", "rid": rid, "sampling_params": {"ignore_eos": True}}
            answers[rid] = (await post(http, f"{url}/generate", body))[1]

        async with anyio.create_task_group() as tg:
            for rid in ("a", "b", "c"):
                tg.start_soon(generate, rid)
            await wait_until(
                lambda: engine.stats.waiting == 2 and engine.stats.generated_tokens > 0
            )
            _, loads = await post_get(http, f"{url}/v1/loads")
            load = loads["loads"][0]
            assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (1, 2)
            assert load["queues"]["waiting"] == 2
            await post(http, f"{url}/abort_request", {"abort_all": True})
    assert engine.statistics().max_running_seen == 1
    waited = [a for a in answers.values() if a["meta_info"]["completion_tokens"] == 0]
    assert len(waited) == 2
    assert all(a["meta_info"]["finish_reason"]["type"] == "abort" for a in answers.values())


async def test_weight_version_spans_and_abort_all_requests(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    config = TextStandInConfig(token_latency_s=0.01)
    async with TextStandInEngine(config, tokenizer) as engine:
        url = engine.url
        answers: list[Any] = []

        async def generate() -> None:
            body = {"text": "x", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
            answers.append((await post(http, f"{url}/generate", body))[1])

        async with anyio.create_task_group() as tg:
            tg.start_soon(generate)
            await wait_until(lambda: engine.stats.generated_tokens >= 3)
            await post(
                http,
                f"{url}/update_weight_version",
                {"new_version": "v2", "abort_all_requests": False},
            )
        spans = answers[0]["meta_info"]["weight_versions"]
        assert [s["version"] for s in spans] == ["default", "v2"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == 40
        assert spans[0]["end"] == spans[1]["start"]
        answers.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(generate)
            await wait_until(lambda: engine.stats.running == 1)
            # SGLang's default: every running request is aborted.
            await post(http, f"{url}/update_weight_version", {"new_version": "v3"})
        assert answers[0]["meta_info"]["finish_reason"]["type"] == "abort"


def test_the_engine_runs_in_a_child_process() -> None:
    import urllib.request

    with TextEngineProcess(TextStandInConfig(max_running=2)) as engine:
        body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode()
        request = urllib.request.Request(
            f"{engine.url}/generate", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            generated = json.loads(answer.read())
        stats = engine.stats()
        assert not hasattr(engine, "set_faults")  # the text stand-in has no fault switches
    assert generated["meta_info"]["completion_tokens"] == 2
    assert stats["generated_tokens"] == 2 and stats["requests"][0]["text"] == "hi"
    assert not engine.is_alive()


async def test_random_answers_follow_seed_rid_and_prompt(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
        url = f"{engine.url}/generate"

        async def ids(rid: str, text: str = "x", **params: Any) -> list[int]:
            body = {"text": text, "rid": rid, "sampling_params": params}
            return list((await post(http, url, body))[1]["output_ids"])

        assert await ids("a") == await ids("a")
        assert await ids("a") != await ids("b")
        assert await ids("a") != await ids("a", text="y")
        assert await ids("a", sampling_seed=7) == await ids("b", sampling_seed=7)
        _, top = await post(
            http,
            url,
            {"text": "x", "return_logprob": True, "top_logprobs_num": 2, "sampling_params": {}},
        )
        meta = top["meta_info"]
        assert meta["output_top_logprobs"] == [[e] for e in meta["output_token_logprobs"]]
    with pytest.raises(ValueError, match="seed"):
        TextPolicy(seed="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pattern"):
        TextRule("(unclosed", "x")


async def test_a_client_that_goes_away_leaves_nothing_running(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    config = TextStandInConfig(token_latency_s=0.01)
    async with TextStandInEngine(config, tokenizer) as engine:
        body = {"text": "x", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, http, f"{engine.url}/generate", body)
            await wait_until(lambda: engine.stats.generated_tokens > 0)
            tg.cancel_scope.cancel()  # the client goes away mid-generation
        await wait_until(lambda: engine.stats.running == 0)
        made = engine.stats.generated_tokens
        await anyio.sleep(0.05)
        assert engine.stats.generated_tokens == made  # nothing generates for nobody
        assert made < 1000


async def test_warm_up_answers_503_and_weights_from_disk_set_the_version(
    tokenizer: Any, http: aiohttp.ClientSession, captures: Path
) -> None:
    async with TextStandInEngine(TextStandInConfig(warmup_s=0.3), tokenizer) as engine:
        url = engine.url
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 503
        status, _ = await post(http, f"{url}/generate", {"text": "x"})
        assert status == 503
        status, _ = await post(http, f"{url}/v1/chat/completions", {"messages": []})
        assert status == 503
        await anyio.sleep(0.35)
        async with http.get(f"{url}/health_generate") as resp:
            assert resp.status == 200
        status, answer = await post(
            http,
            f"{url}/update_weights_from_disk",
            {"model_path": "/models/x", "weight_version": "step-8"},
        )
        assert status == 200
        assert answer == capture_text(captures, "update_weights_from_disk.txt")
        assert engine.statistics().weight_version == "step-8"
        status, _ = await post(http, f"{url}/update_weights_from_disk", {"weight_version": "9"})
        assert status == 400
    with pytest.raises(ValueError, match="warmup_s"):
        TextStandInConfig(warmup_s=-1)


async def test_long_prompts_and_the_tokenizer_load_stay_off_the_loop(
    http: aiohttp.ClientSession,
) -> None:
    # The autouse loop-block fixture fails this test if any of it blocks the loop.
    long_text = "The quick brown fox jumps over the lazy dog. " * 6000
    config = TextStandInConfig(context_length=200_000)
    async with TextStandInEngine(config) as engine:  # loads the tokenizer itself
        url = engine.url
        status, answer = await post(
            http, f"{url}/generate", {"text": long_text, "sampling_params": {"max_new_tokens": 2}}
        )
        assert status == 200 and answer["meta_info"]["prompt_tokens"] > 50_000
        messages = [{"role": "user", "content": long_text}]
        status, chat = await post(
            http, f"{url}/v1/chat/completions", {"messages": messages, "max_tokens": 2}
        )
        assert status == 200 and chat["usage"]["prompt_tokens"] > 50_000


async def test_prompts_past_the_context_are_refused_in_sglangs_words(
    tokenizer: Any, http: aiohttp.ClientSession
) -> None:
    async with TextStandInEngine(TextStandInConfig(context_length=10), tokenizer) as engine:
        url = engine.url
        status, answer = await post(http, f"{url}/generate", {"input_ids": list(range(1, 11))})
        assert status == 400
        assert answer == {
            "error": {
                "message": "The input (10 tokens) is longer than the model's context length"
                " (10 tokens)."
            }
        }
        status, answer = await post(
            http,
            f"{url}/generate",
            {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 6}},
        )
        assert status == 400
        assert answer["error"]["message"].startswith(
            "Requested token count exceeds the model's maximum context length of 10 tokens."
            " You requested a total of 10 tokens: 4 tokens from the input messages and 6"
            " tokens for the completion."
        )
        status, fits = await post(
            http,
            f"{url}/generate",
            {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 5}},
        )
        assert status == 200 and fits["meta_info"]["completion_tokens"] <= 5
        status, chat = await post(
            http,
            f"{url}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a longer question than fits"}]},
        )
        assert status == 400 and chat["object"] == "error"
        assert "context length (10 tokens)" in chat["message"]
