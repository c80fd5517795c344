"""Random tensor trees survive both wire forms with dtype, shape and bytes intact."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from safetensors.torch import load

from miles_lite.codecs.body import ALIGNMENT, decode_json, decode_msgpack, iter_refs
from miles_lite.codecs.tensors import decode_to_tensors, materialize
from miles_lite.testing import (
    encode_json_body,
    encode_msgpack_body,
    encode_msgpack_pieces,
    encode_tensor_map,
)
from tests.codecs.strategies import DTYPES, sample_trees, tensors
from tests.codecs.wire import aligned_buffer, iter_tensors, same_tensor, same_tree

_SETTINGS = settings(deadline=None, max_examples=60)


@_SETTINGS
@given(items=sample_trees(with_bytes=True))
def test_msgpack_round_trip_keeps_dtype_shape_and_bytes(items: list[dict[str, Any]]) -> None:
    body = bytearray(encode_msgpack_body(items))
    assert same_tree(decode_to_tensors(body, "application/msgpack"), items)


@_SETTINGS
@given(items=sample_trees(with_bytes=False))
def test_json_round_trip_keeps_dtype_shape_and_bytes(items: list[dict[str, Any]]) -> None:
    body = encode_json_body(items)
    assert same_tree(decode_to_tensors(body, "application/json"), items)


@_SETTINGS
@given(items=sample_trees(with_bytes=True))
def test_aligned_decoding_puts_every_tensor_on_64_bytes(items: list[dict[str, Any]]) -> None:
    buf = aligned_buffer(encode_msgpack_body(items))
    decoded = decode_msgpack(memoryview(buf), align=True)
    refs = list(iter_refs(decoded.items))
    assert all(r.offset % ALIGNMENT == 0 for r in refs)
    out = materialize(decoded.items, buf)
    assert all(t.data_ptr() % ALIGNMENT == 0 for t in iter_tensors(out) if t.numel())
    assert same_tree(out, items)


@_SETTINGS
@given(items=sample_trees(with_bytes=True))
def test_aligned_tensors_do_not_overlap(items: list[dict[str, Any]]) -> None:
    buf = aligned_buffer(encode_msgpack_body(items))
    refs = sorted(
        iter_refs(decode_msgpack(memoryview(buf), align=True).items), key=lambda r: r.offset
    )
    for before, after in itertools.pairwise(refs):
        assert before.offset + before.nbytes <= after.offset


@_SETTINGS
@given(items=sample_trees(with_bytes=True))
def test_pieces_join_to_the_msgpack_body(items: list[dict[str, Any]]) -> None:
    assert b"".join(encode_msgpack_pieces(items)) == encode_msgpack_body(items)


@_SETTINGS
@given(items=sample_trees(with_bytes=False))
def test_json_layout_is_aligned_and_covers_every_blob(items: list[dict[str, Any]]) -> None:
    decoded = decode_json(encode_json_body(items))
    refs = list(iter_refs(decoded.items))
    assert all(r.offset % ALIGNMENT == 0 for r in refs)
    assert all(r.offset + r.nbytes <= decoded.nbytes for r in refs)
    assert [len(blob) for _, blob in decoded.blobs] == [r.nbytes for r in refs]
    assert decoded.tensor_bytes() == sum(t.numel() * t.element_size() for t in iter_tensors(items))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(), (0,), (3, 0, 2), (2, 3), (1, 2, 1, 3), (2, 1, 2, 1, 2)], ids=str
)
def test_every_dtype_and_rank_round_trips_in_both_forms(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    t = (
        (torch.arange(max(1, torch.Size(shape).numel())) % 7)
        .to(dtype)[: torch.Size(shape).numel()]
        .reshape(shape)
    )
    items = [{"x": t, "nested": {"list": [t, None]}}]
    msgpack_out = decode_to_tensors(bytearray(encode_msgpack_body(items)), "application/msgpack")
    json_out = decode_to_tensors(encode_json_body(items), "application/json")
    assert same_tree(msgpack_out, items)
    assert same_tree(json_out, items)
    assert b"".join(encode_msgpack_pieces(items)) == encode_msgpack_body(items)


@settings(deadline=None, max_examples=40)
@given(t=tensors())
def test_one_tensor_map_is_the_reference_safetensors_file(t: torch.Tensor) -> None:
    wire = encode_tensor_map(t)
    assert wire["shape"] == list(t.shape)
    assert wire["dtype"] == str(t.dtype)
    assert same_tensor(load(wire["data"])["t"], t.contiguous())
