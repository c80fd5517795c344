from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgpack
import pytest
import torch

from miles_lite.codecs.tensor_map import parse_safetensors
from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.testing import (
    EngineStats,
    StandInConfig,
    StandInEngine,
    StandInError,
    synthetic_sample,
)
from tests.testing.replies import get, post, post_raw

pytestmark = pytest.mark.anyio

#: The request that produced the capture's shapes: 2 samples, 3 steps, 4x8x8 latents.
CAPTURE_REQUEST: dict[str, Any] = {
    "prompt": "a cat",
    "seed": 42,
    "rid": "req-abc",
    "num_outputs_per_prompt": 2,
    "num_inference_steps": 3,
    "guidance_scale": 4.0,
}
#: Scalars the capture leaves null; the stand-in fills them with numbers.
TIMING_KEYS = {"inference_time_s", "peak_memory_mb"}


def structure(value: Any, key: str = "") -> Any:
    """The shape of a decoded msgpack tree: key order, nesting, types, tensor-map layout."""
    if isinstance(value, dict) and value.get("__tensor__") is True:
        data = value["data"]
        (n,) = memoryview(data)[:8].cast("Q")
        return (
            "tensor",
            list(value),
            value["dtype"],
            value["shape"],
            type(data),
            bytes(data[: 8 + n]),
        )
    if isinstance(value, dict):
        return [(k, structure(v, k)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *(structure(v) for v in value)]
    if key in TIMING_KEYS:
        return "number or null"
    return type(value).__name__


async def test_msgpack_answer_has_the_capture_structure(
    captures: Path, session: aiohttp.ClientSession
) -> None:
    capture = msgpack.unpackb(
        (captures / "rollout_generate_sample.msgpack").read_bytes(), raw=False
    )
    async with StandInEngine() as engine:
        reply = await post(session, engine.url, CAPTURE_REQUEST)
    assert reply.status == 200
    assert reply.content_type == "application/msgpack"
    ours = msgpack.unpackb(reply.body, raw=False)
    assert structure(ours) == structure(capture)
    for item in ours:
        assert isinstance(item["inference_time_s"], float)
        assert isinstance(item["peak_memory_mb"], float)


async def test_answer_holds_the_synthetic_samples(session: aiohttp.ClientSession) -> None:
    config = StandInConfig()
    async with StandInEngine(config) as engine:
        reply = await post(session, engine.url, CAPTURE_REQUEST)
    decoded = decode_to_tensors(bytearray(reply.body), reply.content_type)
    for i, item in enumerate(decoded):
        expected = synthetic_sample(
            seed=42, sample_index_in_request=i, request=CAPTURE_REQUEST, config=config
        )
        assert torch.equal(item["dit_trajectory"]["latents"], expected["dit_trajectory"]["latents"])
        assert item["dit_trajectory"]["latents"].flatten()[0].item() == 42 + i
        assert item["seed"] == 42


def assert_same_tree(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same_tree(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, path


async def test_json_form_decodes_to_the_same_tensors_without_sigmas(
    session: aiohttp.ClientSession,
) -> None:
    async with StandInEngine(StandInConfig(wire="json")) as engine:
        json_reply = await post(session, engine.url, CAPTURE_REQUEST)
    async with StandInEngine() as engine:
        msgpack_reply = await post(session, engine.url, CAPTURE_REQUEST)
    assert json_reply.content_type == "application/json"
    raw = json.loads(json_reply.body)
    assert isinstance(raw[0]["generated_output"]["data"], str)  # base64 text
    from_json = decode_to_tensors(bytearray(json_reply.body), json_reply.content_type)
    from_msgpack = decode_to_tensors(bytearray(msgpack_reply.body), msgpack_reply.content_type)
    for a, b in zip(from_json, from_msgpack, strict=True):
        assert list(a["dit_trajectory"]) == ["latents", "timesteps"]
        del b["dit_trajectory"]["sigmas"]
        assert_same_tree(a, b)


async def test_bf16_video_answer(session: aiohttp.ClientSession) -> None:
    async with StandInEngine(StandInConfig(dtype="bfloat16")) as engine:
        reply = await post(session, engine.url, {"prompt": "a dog", "seed": 7, "num_frames": 5})
    raw = msgpack.unpackb(reply.body, raw=False)[0]
    latents = raw["dit_trajectory"]["latents"]
    assert latents["dtype"] == "torch.bfloat16" and latents["shape"] == [4, 4, 5, 8, 8]
    parse_safetensors(
        memoryview(latents["data"]), dtype=latents["dtype"], shape=latents["shape"], path="latents"
    )
    decoded = decode_to_tensors(bytearray(reply.body), reply.content_type)[0]
    assert decoded["dit_trajectory"]["latents"].dtype == torch.bfloat16
    assert decoded["generated_output"].shape == (3, 5, 16, 16)


async def test_eval_request_answers_only_outputs(session: aiohttp.ClientSession) -> None:
    async with StandInEngine() as engine:
        reply = await post(
            session,
            engine.url,
            {"prompt": "x", "seed": 1, "rollout": False, "num_outputs_per_prompt": 3},
        )
    items = msgpack.unpackb(reply.body, raw=False)
    assert len(items) == 3
    assert all(list(item) == ["request_id", "prompt", "seed", "generated_output"] for item in items)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_inference_steps", 0),
        ("num_outputs_per_prompt", -1),
        ("rollout_noise_level", -0.5),
        ("rollout_sde_type", "langevin"),
        ("width", 17),
        ("rollout_sde_step_indices", [5]),
    ],
)
async def test_bad_value_is_400_invalid_sampling_params(
    session: aiohttp.ClientSession, field: str, value: Any
) -> None:
    async with StandInEngine() as engine:
        reply = await post(session, engine.url, {"prompt": "x", "seed": 1, field: value})
    assert reply.status == 400
    detail = reply.json()["detail"]
    assert detail.startswith("Invalid sampling params: ") and field in detail


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"prompt": "x", "seed": 1, "width": "abc"}, ["body", "width"]),
        ({"prompt": "x", "seed": "1"}, ["body", "seed"]),
        ({"prompt": "x", "seed": 1, "rollout": "yes"}, ["body", "rollout"]),
        ({"seed": 1}, ["body", "prompt"]),
        ([{"prompt": "x"}], ["body"]),
    ],
)
async def test_wrong_type_is_422(session: aiohttp.ClientSession, body: Any, loc: list[str]) -> None:
    async with StandInEngine() as engine:
        reply = await post(session, engine.url, body)
        garbled = await post_raw(session, engine.url, b"{not json")
    assert reply.status == 422
    assert [error["loc"] for error in reply.json()["detail"]] == [loc]
    assert garbled.status == 422


@pytest.mark.parametrize("seed", ["missing", None])
async def test_missing_seed_fails_with_500_after_generating(
    session: aiohttp.ClientSession, seed: Any
) -> None:
    body: dict[str, Any] = {"prompt": "x"} if seed == "missing" else {"prompt": "x", "seed": None}
    async with StandInEngine(StandInConfig(step_latency_s=0.02)) as engine:
        start = anyio.current_time()
        reply = await post(session, engine.url, body)
        elapsed = anyio.current_time() - start
        assert engine.stats.max_generations_in_flight == 1  # it did take a generation slot
    assert reply.status == 500
    assert "seed" in reply.json()["detail"]
    assert elapsed >= 0.05  # 3 steps x 0.02 s, a lower bound only


async def test_warming_up_answers_503_then_200(session: aiohttp.ClientSession) -> None:
    async with StandInEngine(StandInConfig(warmup_s=0.3)) as engine:
        assert (await get(session, engine.url, "/health")).status == 503
        assert (await get(session, engine.url, "/health_generate")).status == 503
        assert (await post(session, engine.url, {"prompt": "x", "seed": 1})).status == 503
        await anyio.sleep(0.3)  # sleeps at least that long: warm-up is over
        assert (await get(session, engine.url, "/health")).status == 200
        assert (await post(session, engine.url, {"prompt": "x", "seed": 1})).status == 200
        assert engine.stats.requests_failed == 1 and engine.stats.requests_served == 1


async def test_control_endpoints(session: aiohttp.ClientSession) -> None:
    async with StandInEngine(StandInConfig(model_path="models/tiny")) as engine:
        health = await get(session, engine.url, "/health")
        info = (await get(session, engine.url, "/model_info")).json()
        server = (await get(session, engine.url, "/server_info")).json()
        models = (await get(session, engine.url, "/v1/models")).json()
    assert health.status == 200 and health.body == b""
    assert info["model_path"] == "models/tiny" and info["is_generation"] is True
    assert server["version"] == "0.5.23" and server["port"] == int(engine.url.rsplit(":", 1)[1])
    assert models["object"] == "list" and models["data"][0]["id"] == "models/tiny"


async def test_k_requests_generate_at_a_time(session: aiohttp.ClientSession) -> None:
    config = StandInConfig(max_concurrent=2, step_latency_s=0.02)
    async with StandInEngine(config) as engine:
        async with anyio.create_task_group() as tg:
            for seed in range(4):
                tg.start_soon(post, session, engine.url, {"prompt": "x", "seed": seed})
        stats = engine.stats
        assert stats.max_generations_in_flight == 2
        assert stats.requests_served == 4 and stats.samples_served == 4
        assert stats.generations_in_flight == stats.requests_waiting == 0
        assert sorted(request["seed"] for request in stats.requests) == [0, 1, 2, 3]


async def wait_until(engine: StandInEngine, predicate: Callable[[EngineStats], bool]) -> None:
    with anyio.fail_after(10):
        await engine.wait_stats(predicate)


async def test_abort_by_rid_prefix_answers_empty_at_once(session: aiohttp.ClientSession) -> None:
    # An hour per step: only an abort ends these requests.
    config = StandInConfig(max_concurrent=2, step_latency_s=3600.0)
    replies: dict[str, Any] = {}

    answered = {rid: anyio.Event() for rid in ("job1", "job10", "job2")}

    async def generate(rid: str) -> None:
        replies[rid] = await post(session, engine.url, {"prompt": "x", "seed": 1, "rid": rid})
        answered[rid].set()

    async with StandInEngine(config) as engine, anyio.create_task_group() as tg:
        for rid in ("job1", "job10", "job2"):
            tg.start_soon(generate, rid)
        await wait_until(engine, lambda s: s.generations_in_flight == 2 and s.requests_waiting == 1)
        aborted = await post(session, engine.url, {"rid": "job1"}, path="/abort_request")
        assert aborted.status == 200 and aborted.body == b""
        with anyio.fail_after(10):
            await answered["job1"].wait()
            await answered["job10"].wait()
        assert "job2" not in replies
        assert engine.stats.generations_in_flight == 1 and engine.stats.requests_waiting == 0
        assert (
            await post(session, engine.url, {"rid": "nobody"}, path="/abort_request")
        ).status == 200
        assert (
            await post(session, engine.url, {"abort_all": True}, path="/abort_request")
        ).status == 200
    assert all(
        reply.status == 200 and msgpack.unpackb(reply.body) == [] for reply in replies.values()
    )
    assert engine.stats.requests_aborted == 3 and engine.stats.requests_served == 0


async def test_close_ends_waiting_requests_and_refuses_reuse(
    session: aiohttp.ClientSession,
) -> None:
    engine = StandInEngine(StandInConfig(step_latency_s=3600.0))
    await engine.start()
    replies: list[int] = []

    async def generate() -> None:
        try:
            replies.append((await post(session, engine.url, {"prompt": "x", "seed": 1})).status)
        except aiohttp.ClientError:
            replies.append(-1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(generate)
        await wait_until(engine, lambda s: s.generations_in_flight == 1)
        with anyio.fail_after(5):
            await engine.aclose()
    assert replies in ([503], [-1])
    await engine.aclose()  # idempotent
    with pytest.raises(StandInError, match="closed"):
        await engine.start()
