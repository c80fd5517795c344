"""read_msgpack agrees with msgpack-python, returns bins as spans, and refuses bad input."""

from __future__ import annotations

import array
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_lite.codecs.msgpack_reader import Span, read_msgpack
from miles_lite.errors import CodecError
from tests.codecs.strategies import msgpack_values


def _same(ours: Any, ref: Any, body: memoryview) -> bool:
    """``ours`` (spans for bins) equals msgpack-python's ``ref`` (bytes for bins)."""
    if isinstance(ours, Span):
        return isinstance(ref, bytes) and bytes(body[ours.start : ours.stop]) == ref
    if isinstance(ours, list):
        return (
            isinstance(ref, list)
            and len(ours) == len(ref)
            and all(_same(a, b, body) for a, b in zip(ours, ref, strict=True))
        )
    if isinstance(ours, dict):
        return (
            isinstance(ref, dict)
            and list(ours) == list(ref)
            and all(_same(ours[k], ref[k], body) for k in ours)
        )
    if isinstance(ours, float):
        return isinstance(ref, float) and (
            struct.pack(">d", ours) == struct.pack(">d", ref)
            or (math.isnan(ours) and math.isnan(ref))
        )
    return type(ours) is type(ref) and ours == ref


@settings(deadline=None, max_examples=300)
@given(value=msgpack_values)
def test_reader_agrees_with_msgpack_python(value: Any) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    view = memoryview(body)
    assert _same(read_msgpack(view), msgpack.unpackb(body, raw=False), view)


@settings(deadline=None, max_examples=50)
@given(values=st.lists(st.floats(width=32), max_size=8))
def test_reader_agrees_with_msgpack_python_on_float32(values: list[float]) -> None:
    body = msgpack.packb(values, use_single_float=True)
    assert all(b == 0xCA for b in body[1::5])  # really the float32 form
    view = memoryview(body)
    assert _same(read_msgpack(view), msgpack.unpackb(body), view)


@pytest.mark.parametrize(
    "value",
    [
        0,
        127,
        128,
        -1,
        -32,
        -33,
        255,
        256,
        65535,
        65536,
        2**32 - 1,
        2**32,
        2**63 - 1,
        2**64 - 1,
        -(2**7),
        -(2**15),
        -(2**31),
        -(2**63),
        "x" * 31,
        "x" * 32,
        "é" * 200,
        "x" * 70_000,
        b"",
        b"x" * 255,
        b"x" * 256,
        b"x" * 70_000,
        list(range(15)),
        list(range(16)),
        list(range(70_000)),
        {str(i): i for i in range(15)},
        {str(i): i for i in range(16)},
        {str(i): None for i in range(70_000)},
        1.5,
        float("inf"),
        float("nan"),
        -0.0,
    ],
    ids=lambda v: f"{type(v).__name__}-{len(v) if hasattr(v, '__len__') else v}",
)
def test_reader_handles_every_length_form(value: Any) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    view = memoryview(body)
    assert _same(read_msgpack(view), msgpack.unpackb(body, raw=False), view)


def test_bins_come_back_as_spans_of_the_body() -> None:
    body = msgpack.packb({"a": b"hello", "b": [b"", b"xyz"]}, use_bin_type=True)
    value = read_msgpack(memoryview(body))
    span = value["a"]
    assert isinstance(span, Span)
    assert len(span) == 5
    assert body[span.start : span.stop] == b"hello"
    assert len(value["b"][0]) == 0
    assert body[value["b"][1].start : value["b"][1].stop] == b"xyz"
    assert repr(span) == f"Span({span.start}, {span.stop})"


def test_bin_map_keys_come_back_as_bytes() -> None:
    body = msgpack.packb({b"k": 1}, use_bin_type=True)
    assert read_msgpack(memoryview(body)) == {b"k": 1}


def test_reader_accepts_a_view_of_another_format() -> None:
    body = msgpack.packb([1, 2, 3])
    words = array.array("B", body)
    assert read_msgpack(memoryview(words)) == [1, 2, 3]


def test_trailing_bytes_are_refused_with_their_offset() -> None:
    body = msgpack.packb([1, 2]) + b"\xc0"
    with pytest.raises(CodecError, match="1 trailing bytes") as info:
        read_msgpack(memoryview(body))
    assert info.value.offset == 3


def test_an_empty_body_is_refused() -> None:
    with pytest.raises(CodecError, match="truncated"):
        read_msgpack(memoryview(b""))


@pytest.mark.parametrize("type_byte", [0xC1, 0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8])
def test_ext_and_reserved_types_are_refused_with_their_offset(type_byte: int) -> None:
    body = b"\x92\x01" + bytes([type_byte]) + b"\x00" * 20
    with pytest.raises(CodecError, match=f"0x{type_byte:02x}") as info:
        read_msgpack(memoryview(body))
    assert info.value.offset == 2


def test_invalid_utf8_in_a_str_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="malformed"):
        read_msgpack(memoryview(b"\xa2\xff\xfe"))


@pytest.mark.parametrize(
    "body",
    [
        b"\xc4\x05abc",  # bin8 of 5 with 3 bytes
        b"\xc5\x00",  # bin16 length cut
        b"\xdb\xff\xff\xff\xff",  # str32 of 4 GiB
        b"\xdd\xff\xff\xff\xff",  # array32 of 4 G elements, none present
        b"\xdf\xff\xff\xff\xff\xa1k",  # map32 with a key and no value
        b"\xcf\x00\x00",  # uint64 cut
        b"\xcb\x00",  # float64 cut
    ],
)
def test_length_prefixes_beyond_the_body_are_truncation_errors(body: bytes) -> None:
    with pytest.raises(CodecError, match="truncated"):
        read_msgpack(memoryview(body))


def test_nesting_of_64_levels_is_accepted() -> None:
    body = b"\x91" * 64 + b"\x00"
    value = read_msgpack(memoryview(body))
    for _ in range(64):
        value = value[0]
    assert value == 0


@pytest.mark.parametrize("depth", [66, 1000, 100_000])
def test_nesting_beyond_64_levels_is_a_codec_error(depth: int) -> None:
    for opener in (b"\x91", b"\x81\xa1k"):
        with pytest.raises(CodecError, match="deeper than 64"):
            read_msgpack(memoryview(opener * depth + b"\xc0"))


@pytest.mark.parametrize("body", [b"\x81\x90\x00", b"\x81\x80\x00", b"\x81\x91\x01\xc0"])
def test_a_map_key_that_is_an_array_or_map_is_a_codec_error(body: bytes) -> None:
    with pytest.raises(CodecError):
        read_msgpack(memoryview(body))
