"""Every input ends as exactly one output or one CodecError: truncated, corrupted, too deep."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_lite.codecs.body import decode_msgpack
from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.errors import CodecError
from miles_lite.testing import encode_json_body, encode_msgpack_body

MSGPACK = "application/msgpack"
JSON = "application/json"

#: Every msgpack type byte that starts a different kind of value, and the edges of the fix forms.
TYPE_BYTES = sorted(
    {0x00, 0x01, 0x7F, 0x80, 0x81, 0x8F, 0x90, 0x91, 0x9F, 0xA0, 0xA1, 0xBF}
    | set(range(0xC0, 0xE0))
    | {0xE0, 0xFF}
)
#: JSON characters that change structure or number syntax, and base64 letters.
JSON_CHARS = b'"[]{},:0123456789.eE-+tfn \\aA/='


def _small_answer() -> list[dict[str, Any]]:
    """One sample with every kind of value: tensors (f32, bf16, empty), groups, None, list."""
    return [
        {
            "request_id": "r",
            "seed": 1,
            "generated_output": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "dit_trajectory": {"latents": torch.ones(2, 1, dtype=torch.bfloat16), "sigmas": None},
            "ids": [1, 2],
            "empty": torch.zeros(0, 2),
        }
    ]


SMALL_MSGPACK = encode_msgpack_body(_small_answer())
SMALL_JSON = encode_json_body(_small_answer())


def _outcome(body: bytes | bytearray, content_type: str) -> str:
    """Decode fully (tensors included); the name of any exception that is not a CodecError."""
    try:
        decode_to_tensors(bytearray(body), content_type)
    except CodecError:
        return "CodecError"
    except Exception as exc:  # the point: anything else is a bug
        return f"{type(exc).__name__}: {exc}"[:120]
    return "ok"


def _outcome_aligned(body: bytes | bytearray) -> str:
    try:
        decode_msgpack(memoryview(bytearray(body)), align=True)
    except CodecError:
        return "CodecError"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:120]
    return "ok"


def test_every_truncation_of_a_msgpack_body_is_a_codec_error() -> None:
    outcomes = Counter(_outcome(SMALL_MSGPACK[:n], MSGPACK) for n in range(len(SMALL_MSGPACK)))
    assert outcomes == {"CodecError": len(SMALL_MSGPACK)}


def test_every_truncation_of_a_msgpack_body_is_a_codec_error_when_aligning() -> None:
    outcomes = Counter(_outcome_aligned(SMALL_MSGPACK[:n]) for n in range(len(SMALL_MSGPACK)))
    assert outcomes == {"CodecError": len(SMALL_MSGPACK)}


def test_every_truncation_of_a_json_body_is_a_codec_error() -> None:
    outcomes = Counter(_outcome(SMALL_JSON[:n], JSON) for n in range(len(SMALL_JSON)))
    assert outcomes == {"CodecError": len(SMALL_JSON)}


def test_truncating_the_capture_anywhere_is_a_codec_error(captures: Path) -> None:
    capture = (captures / "rollout_generate_sample.msgpack").read_bytes()
    # Every cut in the first sample's structure and the end, and a stride through the rest.
    lengths = {*range(400), *range(0, len(capture), 41), *range(len(capture) - 400, len(capture))}
    outcomes = Counter(_outcome(capture[:n], MSGPACK) for n in sorted(lengths))
    assert outcomes == {"CodecError": len(lengths)}


def test_every_single_byte_substitution_in_a_msgpack_body_decodes_or_is_a_codec_error() -> None:
    outcomes: Counter[str] = Counter()
    for i in range(len(SMALL_MSGPACK)):
        for value in TYPE_BYTES:
            body = bytearray(SMALL_MSGPACK)
            body[i] = value
            outcomes[_outcome(body, MSGPACK)] += 1
    assert set(outcomes) <= {"ok", "CodecError"}, outcomes


def test_every_single_char_substitution_in_a_json_body_decodes_or_is_a_codec_error() -> None:
    outcomes: Counter[str] = Counter()
    for i in range(len(SMALL_JSON)):
        for value in JSON_CHARS:
            body = bytearray(SMALL_JSON)
            body[i] = value
            outcomes[_outcome(body, JSON)] += 1
    assert set(outcomes) <= {"ok", "CodecError"}, outcomes


_flips = st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)), min_size=1, max_size=4)


def _flipped(body: bytes, flips: list[tuple[int, int]]) -> bytearray:
    out = bytearray(body)
    for pos, value in flips:
        out[pos % len(out)] = value
    return out


@settings(deadline=None, max_examples=150, derandomize=True)
@given(flips=_flips)
def test_random_byte_flips_in_a_json_body_decode_or_are_codec_errors(
    flips: list[tuple[int, int]],
) -> None:
    assert _outcome(_flipped(SMALL_JSON, flips), JSON) in ("ok", "CodecError")


@settings(deadline=None, max_examples=150, derandomize=True)
@given(flips=_flips)
def test_random_byte_flips_in_a_msgpack_body_decode_or_are_codec_errors(
    flips: list[tuple[int, int]],
) -> None:
    body = _flipped(SMALL_MSGPACK, flips)
    assert _outcome(body, MSGPACK) in ("ok", "CodecError")
    assert _outcome_aligned(body) in ("ok", "CodecError")


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_msgpack_nested_deeper_than_64_levels_is_a_codec_error(depth: int) -> None:
    body = b"\x91\x81\xa1x" + b"\x91" * depth + b"\xc0"
    with pytest.raises(CodecError, match="deeper than 64"):
        decode_to_tensors(bytearray(body), MSGPACK)


@pytest.mark.parametrize("depth", [600, 100_000])
def test_json_nested_very_deep_is_a_codec_error(depth: int) -> None:
    body = b'[{"x":' + b"[" * depth + b"]" * depth + b"}]"
    with pytest.raises(CodecError):
        decode_to_tensors(body, JSON)
