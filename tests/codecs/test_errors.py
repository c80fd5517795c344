"""Each way a body can be wrong raises a CodecError that names the field path or byte."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest
import torch

from miles_lite.codecs.body import decode_body, decode_json, decode_msgpack, wire_form
from miles_lite.codecs.tensor_map import parse_safetensors
from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.errors import CodecError, MilesLiteError
from miles_lite.testing import encode_json_body, encode_msgpack_body, encode_tensor_map
from tests.codecs.wire import (
    f32_map,
    json_body,
    msgpack_body,
    one_tensor_file,
    safetensors_file,
    tensor_map,
)

MSGPACK = "application/msgpack"
JSON = "application/json"
FORMS = ["msgpack", "json"]


def _decode(form: str, items: Any) -> Any:
    """Encode ``items`` (tensor maps already built, bins as bytes) in ``form`` and decode."""
    if form == "msgpack":
        return decode_to_tensors(msgpack_body(items), MSGPACK)
    return decode_to_tensors(json_body(_to_base64(items)), JSON)


def _to_base64(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _to_base64(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_base64(v) for v in value]
    return value


def _with(sample_tensor: dict[str, Any], *, key: str = "generated_output") -> list[dict[str, Any]]:
    return [{"request_id": "r", "seed": 1, key: sample_tensor}]


def _raw_f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_codec_error_is_a_miles_lite_error() -> None:
    assert issubclass(CodecError, MilesLiteError)


@pytest.mark.parametrize("form", FORMS)
def test_unknown_dtype_names_the_dtype_and_the_field_path(form: str) -> None:
    wire = encode_tensor_map(torch.ones(2))
    wire["dtype"] = "torch.complex_thing"
    with pytest.raises(CodecError, match=r"torch\.complex_thing") as info:
        _decode(form, _with(wire))
    assert "[0].generated_output" in str(info.value)
    assert info.value.path == "[0].generated_output"


@pytest.mark.parametrize("form", FORMS)
def test_error_path_follows_nested_maps_and_lists(form: str) -> None:
    bad = encode_tensor_map(torch.ones(2))
    bad["dtype"] = "torch.complex_thing"
    good = encode_tensor_map(torch.ones(2))
    items = [
        {"ok": good},
        {"dit_trajectory": {"latents": good, "steps": [good, good, bad]}},
    ]
    with pytest.raises(CodecError) as info:
        _decode(form, items)
    assert info.value.path == "[1].dit_trajectory.steps[2]"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [None, 7, ["torch.float32"], "float32", "torch.complex64"])
def test_missing_or_odd_dtypes_are_unknown(form: str, dtype: Any) -> None:
    wire = tensor_map(one_tensor_file("F32", [1], _raw_f32([1.0])), [1], dtype)
    with pytest.raises(CodecError, match="unknown tensor dtype"):
        _decode(form, _with(wire))


@pytest.mark.parametrize("form", FORMS)
def test_shape_disagreeing_with_the_safetensors_header_names_both(form: str) -> None:
    wire = tensor_map(one_tensor_file("F32", [4], _raw_f32([1, 2, 3, 4])), [2, 2], "torch.float32")
    with pytest.raises(CodecError, match=r"shape \[2, 2\] disagrees .* \[4\]") as info:
        _decode(form, _with(wire))
    assert info.value.path == "[0].generated_output"


@pytest.mark.parametrize("form", FORMS)
def test_dtype_disagreeing_with_the_safetensors_header_is_refused(form: str) -> None:
    wire = tensor_map(one_tensor_file("F32", [2], _raw_f32([1, 2])), [2], "torch.float16")
    with pytest.raises(CodecError, match="disagrees with the safetensors dtype 'F32'"):
        _decode(form, _with(wire))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", ["4", [4, -1], [2.0], None, {"a": 1}])
def test_a_shape_that_is_not_a_list_of_non_negative_ints_is_refused(form: str, shape: Any) -> None:
    wire = tensor_map(one_tensor_file("F32", [4], _raw_f32([1, 2, 3, 4])), shape, "torch.float32")
    with pytest.raises(CodecError, match="shape must be a list of non-negative ints"):
        _decode(form, _with(wire))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("offsets", "data"),
    [
        ([0, 8], _raw_f32([1, 2])),  # says two floats for a [1] tensor
        ([0, 2], _raw_f32([1])),  # says half a float
        ([0, 4], b"\x00\x00"),  # offsets run past the data
        ([4, 8], _raw_f32([1])),  # in range count, but past the data
        ([-4, 0], _raw_f32([1])),  # negative start
    ],
)
def test_byte_count_disagreeing_with_dtype_and_shape_is_refused(
    form: str, offsets: list[int], data: bytes
) -> None:
    wire = tensor_map(one_tensor_file("F32", [1], data, offsets), [1], "torch.float32")
    with pytest.raises(CodecError, match="needs 4 bytes") as info:
        _decode(form, _with(wire))
    assert info.value.path == "[0].generated_output"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "no safetensors file"),
        (b"\x01\x02\x03", "no safetensors file"),
        (struct.pack("<Q", 1000) + b"{}", "header length 1000 exceeds"),
        (struct.pack("<Q", 2**63) + b"{}", "header length"),
        (safetensors_file({"x": {}}), "malformed safetensors header"),
        (safetensors_file([1, 2]), "malformed safetensors header"),
        (safetensors_file({"t": {"dtype": "F32", "shape": [1]}}), "malformed safetensors header"),
        (safetensors_file({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}), "malformed"),
        (struct.pack("<Q", 4) + b"{not", "malformed safetensors header"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "malformed safetensors header"),
    ],
)
def test_data_that_is_not_a_one_tensor_safetensors_file_is_refused(
    form: str, data: bytes, message: str
) -> None:
    with pytest.raises(CodecError, match=message) as info:
        _decode(form, _with(tensor_map(data, [1], "torch.float32")))
    assert info.value.path == "[0].generated_output"


@pytest.mark.parametrize("data", ["AAAA", 12, None, [1, 2], {"a": 1}])
def test_msgpack_tensor_data_that_is_not_bin_is_refused(data: Any) -> None:
    body = msgpack_body(_with(tensor_map(data, [1], "torch.float32")))
    with pytest.raises(CodecError, match="must be msgpack bin") as info:
        decode_to_tensors(body, MSGPACK)
    assert info.value.path == "[0].generated_output"


@pytest.mark.parametrize("data", ["not base64!", "AAA", "é", None, 1.5])
def test_json_tensor_data_that_is_not_base64_is_refused(data: Any) -> None:
    with pytest.raises(CodecError, match="not base64") as info:
        decode_to_tensors(json_body(_with(tensor_map(data, [1], "torch.float32"))), JSON)
    assert info.value.path == "[0].generated_output"


def test_json_tensor_data_may_be_a_list_of_byte_values() -> None:
    raw = one_tensor_file("F32", [2], _raw_f32([1.5, -2.0]))
    body = json_body(_with(tensor_map(list(raw), [2], "torch.float32")))
    out = decode_to_tensors(body, JSON)
    assert torch.equal(out[0]["generated_output"], torch.tensor([1.5, -2.0]))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("top", [{"a": 1}, 3, "x", None])
def test_a_top_value_that_is_not_an_array_is_refused(form: str, top: Any) -> None:
    with pytest.raises(CodecError, match="must be an array of per-sample maps"):
        _decode(form, top)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("sample", [1, "x", None, [1]])
def test_a_sample_that_is_not_a_map_names_its_index(form: str, sample: Any) -> None:
    with pytest.raises(CodecError, match="sample must be a map") as info:
        _decode(form, [{"ok": 1}, sample])
    assert info.value.path == "[1]"


def test_an_empty_answer_decodes_to_no_samples() -> None:
    assert decode_to_tensors(msgpack_body([]), MSGPACK) == []
    assert decode_to_tensors(b"[]", JSON) == []


def test_trailing_bytes_after_a_msgpack_body_are_refused_with_the_offset() -> None:
    body = bytearray(encode_msgpack_body(_with(torch.ones(2))))
    n = len(body)
    with pytest.raises(CodecError, match="2 trailing bytes") as info:
        decode_to_tensors(body + b"\x00\x00", MSGPACK)
    assert info.value.offset == n
    assert f"(byte {n})" in str(info.value)


@pytest.mark.parametrize("tail", [b"x", b"[]", b"\x00"])
def test_trailing_bytes_after_a_json_body_are_refused(tail: bytes) -> None:
    with pytest.raises(CodecError, match="malformed JSON"):
        decode_json(encode_json_body(_with(torch.ones(2))) + tail)


@pytest.mark.parametrize("body", [b"", b"\xff\xfe\x00", b"{", b"nul", b'[{"a": }]'])
def test_malformed_json_is_refused(body: bytes) -> None:
    with pytest.raises(CodecError, match="malformed JSON"):
        decode_to_tensors(body, JSON)


@pytest.mark.parametrize(
    "content_type",
    ["text/html", "application/octet-stream", "", None, "application/jsonx", "msgpack"],
)
def test_an_unexpected_content_type_is_refused(content_type: str | None) -> None:
    with pytest.raises(CodecError, match="unexpected Content-Type"):
        wire_form(content_type)
    with pytest.raises(CodecError, match="unexpected Content-Type"):
        decode_to_tensors(msgpack_body([]), content_type)


@pytest.mark.parametrize(
    ("content_type", "form"),
    [
        ("application/msgpack", "msgpack"),
        ("application/x-msgpack", "msgpack"),
        ("application/vnd.msgpack", "msgpack"),
        ("Application/MsgPack", "msgpack"),
        ("application/msgpack; charset=binary", "msgpack"),
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        (" APPLICATION/JSON ;charset=UTF-8", "json"),
    ],
)
def test_content_types_with_parameters_and_aliases_are_accepted(
    content_type: str, form: str
) -> None:
    assert wire_form(content_type) == form
    items = [{"x": f32_map([1.0, 2.0], base64_text=form == "json")}]
    body = msgpack_body(items) if form == "msgpack" else json_body(items)
    decoded = decode_body(memoryview(body), content_type)
    assert decoded.items[0]["x"].shape == (2,)
    out = decode_to_tensors(body, content_type)
    assert torch.equal(out[0]["x"], torch.tensor([1.0, 2.0]))


def test_parse_safetensors_returns_the_data_range_inside_the_file() -> None:
    raw = one_tensor_file("F32", [2], _raw_f32([1, 2]))
    start, stop = parse_safetensors(memoryview(raw), dtype="torch.float32", shape=[2], path="p")
    assert raw[start:stop] == _raw_f32([1, 2])


def test_a_map_without_the_tensor_marker_is_plain_data() -> None:
    plain = {"__tensor__": 1, "data": b"abc", "shape": [1], "dtype": "torch.float32"}
    out = decode_msgpack(memoryview(msgpack_body([{"x": plain}]))).items
    assert out == [{"x": plain}]


# --- bugs: each test below fails today; the reason names the line to fix -------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("offsets", [["0", "4"], "ab", [None, None], [0.0, 4.0]], ids=str)
def test_non_integer_data_offsets_are_a_codec_error(form: str, offsets: Any) -> None:
    data = safetensors_file(
        {"t": {"dtype": "F32", "shape": [1], "data_offsets": offsets}}, b"\0" * 4
    )
    with pytest.raises(CodecError):
        _decode(form, _with(tensor_map(data, [1], "torch.float32")))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("shape", "header_shape", "n"), [([True], [1], 1), ([False, 2], [0, 2], 0)]
)
def test_a_shape_with_booleans_is_a_codec_error(
    form: str, shape: list[Any], header_shape: list[int], n: int
) -> None:
    data = one_tensor_file("F32", header_shape, _raw_f32([1.0] * n))
    with pytest.raises(CodecError):
        _decode(form, _with(tensor_map(data, shape, "torch.float32")))


@pytest.mark.parametrize("form", FORMS)
def test_a_deeply_nested_safetensors_header_is_a_codec_error(form: str) -> None:
    header = b"[" * 100_000 + b"]" * 100_000
    data = struct.pack("<Q", len(header)) + header
    with pytest.raises(CodecError):
        _decode(form, _with(tensor_map(data, [1], "torch.float32")))


def test_json_tensor_data_that_is_a_huge_number_is_a_codec_error() -> None:
    body = json_body(_with(tensor_map(10**30, [1], "torch.float32")))
    with pytest.raises(CodecError):
        decode_to_tensors(body, JSON)
