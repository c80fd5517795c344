"""/generate against the real SGLang 0.5.23 server: its own contract, the strict sampling
keys, abort, weight versions, and a structural diff with the text stand-in."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import aiohttp
import anyio
import pytest

from miles_lite.engine.http.client import EngineClient
from miles_lite.errors import EngineStatusError, SamplingParamsError
from miles_lite.sglang.generate_wire import build_generate_payload
from miles_lite.sglang.sampling import SAMPLING_KEYS
from miles_lite.testing import TextStandInConfig, TextStandInEngine

from .shapes import differences, shape_of_all

pytestmark = pytest.mark.anyio

PROMPT_IDS = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def rid() -> str:
    return uuid.uuid4().hex


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, path: str, body: Any) -> tuple[int, Any]:
    async with http.post(url + path, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return resp.status, text


def check_answer(api_types: ModuleType, answer: dict[str, Any]) -> None:
    """SGLang's own contract, then the invariants RL code relies on."""
    api_types.GenerateResponse.from_json_value(answer)
    meta = answer["meta_info"]
    n = meta["completion_tokens"]
    assert len(answer["output_ids"]) == n
    if "output_token_logprobs" in meta:
        assert len(meta["output_token_logprobs"]) == n
        assert [t[1] for t in meta["output_token_logprobs"]] == answer["output_ids"]
    spans = meta["weight_versions"]
    assert sum(s["end"] - s["start"] for s in spans) == n


#: Requests both servers get in the differential test; small budgets (the real server
#: decodes ~5 steps/s at batch 8 on 2 cores).
REQUESTS: dict[str, dict[str, Any]] = {
    "ids_logprob": {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 3},
        "return_logprob": True,
    },
    "text_plain": {"text": "Hello", "sampling_params": {"max_new_tokens": 3}},
    "batch": {
        "input_ids": [PROMPT_IDS, PROMPT_IDS[:4]],
        "sampling_params": {"max_new_tokens": 3},
        "return_logprob": True,
    },
    "n2": {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 3, "n": 2},
        "return_logprob": True,
    },
    "stop_ids": {
        "input_ids": PROMPT_IDS,
        "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_prompt_token_ids": True,
    },
}


async def test_real_answers_satisfy_sglangs_contract(
    sglang_url: str, api_types: ModuleType, http: aiohttp.ClientSession
) -> None:
    for name, body in REQUESTS.items():
        status, answer = await post(http, sglang_url, "/generate", body)
        assert status == 200, (name, answer)
        answers = answer if isinstance(answer, list) else [answer]
        assert len(answers) == (2 if name in ("batch", "n2") else 1), name
        for a in answers:
            check_answer(api_types, a)


async def test_library_payload_satisfies_contract_and_is_accepted(
    sglang_url: str, api_types: ModuleType
) -> None:
    payload = build_generate_payload(
        PROMPT_IDS, {"max_new_tokens": 3, "temperature": 0.7, "top_p": 0.9}, seed=11
    )
    request = api_types.GenerateRequest.from_json_value(payload)
    assert request.sampling_params.sampling_seed == 11
    assert request.logprob_start_len is None  # the prefix cache stays useful
    async with EngineClient() as client:
        answer = await client.post_json(sglang_url, "/generate", payload, request_id=payload["rid"])
    check_answer(api_types, answer)
    assert answer["meta_info"]["id"] == payload["rid"]


async def test_unknown_sampling_key_is_sglangs_400(
    sglang_url: str, api_types: ModuleType, http: aiohttp.ClientSession
) -> None:
    body = {"input_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 4}}
    status, answer = await post(http, sglang_url, "/generate", body)
    assert status == 400
    assert answer["error"].startswith("unknown field `max_tokens`, expected one of")
    # SGLang's own contract refuses it the same way.
    with pytest.raises(api_types.JsonContractError, match="max_tokens"):
        api_types.GenerateRequest.from_json_value(body)
    # Through the engine client: the typed error keeps SGLang's message.
    async with EngineClient() as client:
        with pytest.raises(EngineStatusError) as info:
            await client.post_json(sglang_url, "/generate", body, request_id=rid())
    assert info.value.status == 400
    assert "unknown field `max_tokens`" in str(info.value.body_excerpt)
    # The library refuses it before sending, naming the key SGLang wants.
    with pytest.raises(SamplingParamsError, match="max_new_tokens"):
        build_generate_payload(PROMPT_IDS, {"max_tokens": 4})


async def test_library_sampling_keys_are_sglangs(
    sglang_url: str, http: aiohttp.ClientSession
) -> None:
    status, answer = await post(
        http, sglang_url, "/generate", {"text": "x", "sampling_params": {"bogus_key": 1}}
    )
    assert status == 400
    allowed = set(re.findall(r"`([a-z_]+)`", answer["error"].split("expected one of", 1)[1]))
    assert set(SAMPLING_KEYS) == allowed, (
        f"only in the library: {sorted(set(SAMPLING_KEYS) - allowed)}; "
        f"only in SGLang: {sorted(allowed - set(SAMPLING_KEYS))}"
    )


async def running(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/v1/loads") as resp:
        loads = await resp.json()
    return sum(int(x["num_running_reqs"]) + int(x["num_waiting_reqs"]) for x in loads["loads"])


async def wait_loads(
    http: aiohttp.ClientSession, url: str, *, busy: bool, timeout_s: float
) -> None:
    """Poll /v1/loads until some request runs (busy) or none does; fail after timeout_s."""
    for _ in range(int(timeout_s / 0.05)):
        if (await running(http, url) > 0) == busy:
            return
        await anyio.sleep(0.05)
    pytest.fail(f"/v1/loads never showed {'a running request' if busy else 'idle'}")


async def test_abort_mid_generation_returns_partial_output_then_idle(
    sglang_url: str, api_types: ModuleType, http: aiohttp.ClientSession
) -> None:
    victim = rid()
    body = {
        "input_ids": PROMPT_IDS,
        "rid": victim,
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
        "return_logprob": True,
    }
    result: dict[str, Any] = {}

    async def generate() -> None:
        result["status"], result["answer"] = await post(http, sglang_url, "/generate", body)

    async with anyio.create_task_group() as tg:
        tg.start_soon(generate)
        await wait_loads(http, sglang_url, busy=True, timeout_s=60)
        await anyio.sleep(0.5)  # some tokens out
        async with EngineClient() as client:
            assert await client.post_json(sglang_url, "/abort_request", {"rid": victim}) is None
    assert result["status"] == 200
    answer = result["answer"]
    check_answer(api_types, answer)
    meta = answer["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["id"] == victim
    assert 0 < meta["completion_tokens"] < 2000
    await wait_loads(http, sglang_url, busy=False, timeout_s=10)


async def test_update_weight_version_shows_in_answers(
    sglang_url: str, api_types: ModuleType, http: aiohttp.ClientSession
) -> None:
    version = f"step-{uuid.uuid4().hex[:6]}"
    async with EngineClient() as client:
        reply = await client.post_json(
            sglang_url,
            "/update_weight_version",
            {"new_version": version, "abort_all_requests": False},
        )
        assert reply["success"] is True
        info = await client.get_json(sglang_url, "/model_info")
    assert info["weight_version"] == version
    status, answer = await post(http, sglang_url, "/generate", REQUESTS["ids_logprob"])
    assert status == 200
    check_answer(api_types, answer)
    meta = answer["meta_info"]
    assert meta["weight_version"] == version
    assert meta["weight_versions"] == [
        {"version": version, "start": 0, "end": meta["completion_tokens"]}
    ]


#: Structural differences between the stand-in's /generate answers and real SGLang's that
#: are known and reported; each entry is one line of ``differences()``. An entry that no
#: longer shows up fails the test too, so that this list stays true.
#
#: The stand-in has no prefix cache: its ``cached_tokens`` is always 0 and
#: ``cached_tokens_details`` null, where real SGLang reports ``{"device": n, "host": 0}``
#: once a prompt's prefix is cached (every request here after the first).
_NO_PREFIX_CACHE = {
    "only in real SGLang: {p}.meta_info.cached_tokens_details.device (number)",
    "only in real SGLang: {p}.meta_info.cached_tokens_details.host (number)",
}
KNOWN_DIFFERENCES: dict[str, set[str]] = {
    name: {line.format(p=prefix) for line in _NO_PREFIX_CACHE}
    for name, prefix in (("ids_logprob", "$"), ("batch", "$[]"), ("n2", "$[]"), ("stop_ids", "$"))
}


async def test_stand_in_answers_have_real_structure(
    sglang_url: str, api_types: ModuleType, http: aiohttp.ClientSession, tokenizer: Any
) -> None:
    async with TextStandInEngine(TextStandInConfig(), tokenizer) as stand_in:
        report = []
        for name, body in REQUESTS.items():
            # Twice: the second answer is the one with a warm prefix cache, whichever
            # tests ran before.
            await post(http, sglang_url, "/generate", body)
            real_status, real = await post(http, sglang_url, "/generate", body)
            fake_status, fake = await post(http, stand_in.url, "/generate", body)
            assert (real_status, fake_status) == (200, 200), (name, real, fake)
            fakes = fake if isinstance(fake, list) else [fake]
            for a in fakes:
                api_types.GenerateResponse.from_json_value(a)
            diff = differences(shape_of_all([real]), shape_of_all([fake]))
            known = KNOWN_DIFFERENCES.get(name, set())
            unexpected = [line for line in diff if line not in known]
            gone = sorted(known - set(diff))
            if unexpected or gone:
                report.append(f"{name}:")
                report += [f"  {line}" for line in unexpected]
                report += [f"  (known, no longer seen) {line}" for line in gone]
        assert not report, "stand-in vs real SGLang /generate:\n" + "\n".join(report)
