"""Decoded tensors: bf16, eval answers, null groups, old JSON shape, and views of the buffer."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
import torch

from miles_lite.codecs.body import decode_json, decode_msgpack, iter_refs
from miles_lite.codecs.tensor_map import TensorRef
from miles_lite.codecs.tensors import decode_to_tensors, materialize
from miles_lite.testing import encode_json_body, encode_msgpack_body
from tests.codecs.wire import aligned_buffer, same_tree

MSGPACK = "application/msgpack"
JSON = "application/json"
FORMS = ["msgpack", "json"]


def _round_trip(form: str, items: list[dict[str, Any]]) -> list[Any]:
    if form == "msgpack":
        return decode_to_tensors(bytearray(encode_msgpack_body(items)), MSGPACK)
    return decode_to_tensors(encode_json_body(items), JSON)


def _rollout_sample(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "request_id": f"req-{seed}",
        "prompt": "a cat",
        "seed": 42,
        "generated_output": torch.rand(3, 1, 16, 16, generator=g),
        "rollout_log_probs": torch.randn(3, generator=g),
        "rollout_debug_tensors": None,
        "denoising_env": None,
        "dit_trajectory": {
            "latents": torch.randn(4, 4, 8, 8, generator=g),
            "timesteps": torch.tensor([1000.0, 500.0, 0.0]),
            "sigmas": torch.tensor([1.0, 0.6, 0.3, 0.0]),
        },
        "inference_time_s": 1.25,
        "peak_memory_mb": None,
    }


@pytest.mark.parametrize("form", FORMS)
def test_bfloat16_values_survive_decoding(form: str) -> None:
    values = torch.tensor(
        [1.5, -2.25, 3.0e38, -1.0e-38, 0.0, -0.0, float("inf")], dtype=torch.bfloat16
    )
    out = _round_trip(
        form, [{"x": values, "nan": torch.tensor([float("nan")], dtype=torch.bfloat16)}]
    )
    assert out[0]["x"].dtype == torch.bfloat16
    assert torch.equal(out[0]["x"], values)
    assert torch.equal(out[0]["x"].view(torch.int16), values.view(torch.int16))  # -0.0 kept
    assert torch.isnan(out[0]["nan"]).all()


@pytest.mark.parametrize("form", FORMS)
def test_an_eval_answer_with_only_the_output_decodes(form: str) -> None:
    items = [
        {"request_id": "r", "prompt": "p", "seed": 7, "generated_output": torch.rand(1, 3, 8, 8)}
        for _ in range(2)
    ]
    out = _round_trip(form, items)
    assert [list(s) for s in out] == [["request_id", "prompt", "seed", "generated_output"]] * 2
    assert same_tree(out, items)


@pytest.mark.parametrize("form", FORMS)
def test_null_groups_stay_none(form: str) -> None:
    items = [_rollout_sample(0) | {"dit_trajectory": None}]
    out = _round_trip(form, items)
    assert out[0]["dit_trajectory"] is None
    assert out[0]["rollout_debug_tensors"] is None
    assert out[0]["denoising_env"] is None
    assert out[0]["peak_memory_mb"] is None
    assert same_tree(out, items)


def test_json_form_without_sigmas_decodes() -> None:
    items = [_rollout_sample(i) for i in range(2)]
    for sample in items:
        del sample["dit_trajectory"]["sigmas"]
    out = decode_to_tensors(encode_json_body(items), JSON)
    assert [list(s["dit_trajectory"]) for s in out] == [["latents", "timesteps"]] * 2
    assert same_tree(out, items)


def test_both_forms_decode_a_rollout_answer_to_the_same_tensors() -> None:
    items = [_rollout_sample(i) for i in range(3)]
    assert same_tree(_round_trip("msgpack", items), _round_trip("json", items))


def test_msgpack_decoding_copies_nothing_and_json_decoding_lays_out_blobs() -> None:
    items = [_rollout_sample(0)]
    in_place = decode_msgpack(memoryview(encode_msgpack_body(items)))
    assert in_place.in_place and not in_place.blobs
    copied = decode_json(encode_json_body(items))
    assert not copied.in_place
    assert len(copied.blobs) == len(list(iter_refs(copied.items))) == 5
    assert in_place.tensor_bytes() == copied.tensor_bytes() == 4 * (3 * 256 + 3 + 4 * 256 + 3 + 4)


def test_materialized_tensors_view_a_writable_buffer() -> None:
    body = bytearray(encode_msgpack_body([{"x": torch.zeros(4)}]))
    ref = next(iter_refs(decode_msgpack(memoryview(body)).items))
    t = materialize(ref, body)
    t[1] = 1.0
    assert body[ref.offset + 4 : ref.offset + 8] == torch.tensor([1.0]).numpy().tobytes()
    body[ref.offset : ref.offset + 4] = torch.tensor([2.5]).numpy().tobytes()
    assert t.tolist() == [2.5, 1.0, 0.0, 0.0]


def test_decode_to_tensors_gives_tensors_that_view_the_body() -> None:
    body = bytearray(encode_msgpack_body([{"x": torch.arange(4, dtype=torch.int32)}]))
    t = decode_to_tensors(body, MSGPACK)[0]["x"]
    t.fill_(-1)
    assert body.count(b"\xff\xff\xff\xff") >= 4


def test_aligned_tensors_view_the_aligned_buffer() -> None:
    buf = aligned_buffer(encode_msgpack_body([{"x": torch.arange(5, dtype=torch.float64)}]))
    decoded = decode_msgpack(memoryview(buf), align=True)
    t = materialize(decoded.items, buf)[0]["x"]
    assert t.data_ptr() == buf.ctypes.data + decoded.items[0]["x"].offset
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_zero_size_tensors_materialize(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    ref = TensorRef(offset=0, nbytes=0, dtype=str(dtype), shape=shape)
    t = materialize(ref, bytearray())
    assert t.shape == shape and t.dtype == dtype
    out = _round_trip("msgpack", [{"e": torch.empty(shape, dtype=dtype)}])[0]["e"]
    assert out.shape == shape and out.dtype == dtype


def test_materialize_keeps_non_tensor_values_and_structure() -> None:
    tree = {"a": [1, None, "s", {"b": b"x"}], "c": 2.5}
    assert materialize(tree, bytearray()) == tree


def test_the_buffer_stays_alive_while_a_tensor_views_it() -> None:
    items = [{"x": torch.arange(16, dtype=torch.float32)}]
    buf = aligned_buffer(encode_msgpack_body(items))
    alive = weakref.ref(buf.base)  # the array that owns the memory
    decoded = decode_msgpack(memoryview(buf))
    t = materialize(decoded.items, buf)[0]["x"]
    del buf, decoded
    gc.collect()
    assert alive() is not None
    assert t.tolist() == list(map(float, range(16)))
    del t
    gc.collect()
    assert alive() is None


def test_a_bytearray_body_outlives_its_other_references() -> None:
    body = bytearray(encode_msgpack_body([{"x": torch.arange(1000, dtype=torch.int64)}]))
    t = decode_to_tensors(body, MSGPACK)[0]["x"]
    del body
    gc.collect()
    np.zeros(1 << 20, dtype=np.uint8).fill(0xAB)  # reuse freed memory, if any was freed
    assert torch.equal(t, torch.arange(1000, dtype=torch.int64))


def test_json_tensors_live_in_one_fresh_buffer() -> None:
    items = [{"a": torch.arange(3, dtype=torch.int64), "b": torch.ones(2, dtype=torch.float16)}]
    body = encode_json_body(items)
    out = decode_to_tensors(body, JSON)[0]
    a, b = out["a"], out["b"]
    # One buffer, each tensor on its own 64-byte slot: 24 bytes of int64, then the fp16.
    assert b.data_ptr() - a.data_ptr() == 64
    a[0] = 9  # writable: the buffer is a fresh bytearray
    assert out["a"].tolist() == [9, 1, 2]
