"""A zero-copy msgpack reader: ``bin`` values come back as :class:`Span` s of the body.

msgpack-python and msgspec copy every ``bin`` (about 2 GB/s here); a diffusion body is
almost all ``bin``, and its structure is a few hundred small values, so walking it in
Python and slicing the body costs microseconds per response at any size.
"""

from __future__ import annotations

import struct
from typing import Any

from miles_lite.errors import CodecError

__all__ = ["Span", "read_msgpack"]


class Span:
    """Where a ``bin`` value lies in the body: bytes ``[start, stop)``."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int) -> None:
        self.start = start
        self.stop = stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"Span({self.start}, {self.stop})"


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

_MAX_DEPTH = 64


def read_msgpack(body: memoryview) -> Any:
    """Decode one msgpack value that fills ``body`` exactly.

    ``bin`` values are returned as :class:`Span` s of ``body`` (no copy); ``str`` as
    ``str``; maps as ``dict``; arrays as ``list``. Raises :class:`CodecError` with the byte
    offset on truncated or malformed input, on trailing bytes and on ``ext`` types.
    """
    if body.ndim != 1 or body.itemsize != 1:
        body = body.cast("B")
    try:
        value, end = _read(body, 0, 0)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CodecError(f"malformed or truncated msgpack body ({exc})") from exc
    if end != len(body):
        raise CodecError(
            f"msgpack body has {len(body) - end} trailing bytes after the top value", offset=end
        )
    return value


def _need(body: memoryview, pos: int, n: int) -> None:
    if pos + n > len(body):
        raise CodecError(
            f"msgpack body is truncated: needs {n} bytes, {len(body) - pos} left", offset=pos
        )


def _read(body: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    if depth > _MAX_DEPTH:
        raise CodecError("msgpack body nests deeper than 64 levels", offset=pos)
    _need(body, pos, 1)
    b = body[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0xA0 <= b <= 0xBF:
        return _str(body, pos, b & 0x1F)
    if 0x90 <= b <= 0x9F:
        return _array(body, pos, b & 0x0F, depth)
    if 0x80 <= b <= 0x8F:
        return _map(body, pos, b & 0x0F, depth)
    if b == 0xC0:
        return None, pos
    if b == 0xC2:
        return False, pos
    if b == 0xC3:
        return True, pos
    if b in (0xC4, 0xC5, 0xC6):
        n, pos = _length(body, pos, b - 0xC4)
        _need(body, pos, n)
        return Span(pos, pos + n), pos + n
    if b in (0xD9, 0xDA, 0xDB):
        n, pos = _length(body, pos, b - 0xD9)
        return _str(body, pos, n)
    if b in (0xDC, 0xDD):
        n, pos = _length(body, pos, b - 0xDC + 1)
        return _array(body, pos, n, depth)
    if b in (0xDE, 0xDF):
        n, pos = _length(body, pos, b - 0xDE + 1)
        return _map(body, pos, n, depth)
    fixed = _FIXED.get(b)
    if fixed is not None:
        _need(body, pos, fixed.size)
        return fixed.unpack_from(body, pos)[0], pos + fixed.size
    raise CodecError(
        f"unsupported msgpack type byte 0x{b:02x} (ext types are not used)", offset=pos - 1
    )


_FIXED = {
    0xCA: _F32,
    0xCB: _F64,
    0xCC: _U8,
    0xCD: _U16,
    0xCE: _U32,
    0xCF: _U64,
    0xD0: _I8,
    0xD1: _I16,
    0xD2: _I32,
    0xD3: _I64,
}
_LENGTHS = (_U8, _U16, _U32)


def _length(body: memoryview, pos: int, which: int) -> tuple[int, int]:
    s = _LENGTHS[which]
    _need(body, pos, s.size)
    return s.unpack_from(body, pos)[0], pos + s.size


def _str(body: memoryview, pos: int, n: int) -> tuple[str, int]:
    _need(body, pos, n)
    return str(body[pos : pos + n], "utf-8"), pos + n


def _array(body: memoryview, pos: int, n: int, depth: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        value, pos = _read(body, pos, depth + 1)
        out.append(value)
    return out, pos


def _map(body: memoryview, pos: int, n: int, depth: int) -> tuple[dict[Any, Any], int]:
    out = {}
    for _ in range(n):
        key, pos = _read(body, pos, depth + 1)
        if isinstance(key, Span):
            key = bytes(body[key.start : key.stop])
        if isinstance(key, list | dict):
            raise CodecError(
                f"msgpack map key must be a scalar, got {type(key).__name__}", offset=pos
            )
        value, pos = _read(body, pos, depth + 1)
        out[key] = value
    return out, pos
