"""The tensor map of SGLang's diffusion wire format, and the single-tensor safetensors file.

Every tensor at any depth of a ``/rollout/generate`` answer is a map
``{"__tensor__": true, "data": <safetensors file with one tensor "t">, "shape", "dtype"}``,
``data`` being ``bin`` (msgpack) or base64 text (JSON). Nothing here imports torch: parser
workers stay light and start in milliseconds.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from miles_lite.errors import CodecError

__all__ = ["WIRE_DTYPES", "TensorRef", "is_tensor_map", "parse_safetensors"]

#: Wire dtype name -> (safetensors code, item size in bytes). bf16 needs torch to decode.
WIRE_DTYPES: dict[str, tuple[str, int]] = {
    "torch.float64": ("F64", 8),
    "torch.float32": ("F32", 4),
    "torch.float16": ("F16", 2),
    "torch.bfloat16": ("BF16", 2),
    "torch.float8_e4m3fn": ("F8_E4M3", 1),
    "torch.float8_e5m2": ("F8_E5M2", 1),
    "torch.int64": ("I64", 8),
    "torch.int32": ("I32", 4),
    "torch.int16": ("I16", 2),
    "torch.int8": ("I8", 1),
    "torch.uint8": ("U8", 1),
    "torch.bool": ("BOOL", 1),
}
_CODE_TO_WIRE = {code: name for name, (code, _) in WIRE_DTYPES.items()}
_U64 = struct.Struct("<Q")
#: A safetensors header longer than this is not a one-tensor file.
_MAX_HEADER = 1 << 20


@dataclass(frozen=True, slots=True)
class TensorRef:
    """Where a decoded tensor's bytes lie: ``nbytes`` at ``offset`` of some buffer."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    def moved(self, delta: int) -> TensorRef:
        """The same tensor ``delta`` bytes further on."""
        return TensorRef(self.offset + delta, self.nbytes, self.dtype, self.shape)


def is_tensor_map(value: Any) -> bool:
    """Whether ``value`` is a wire tensor map."""
    return isinstance(value, dict) and value.get("__tensor__") is True


def parse_safetensors(data: memoryview, *, dtype: Any, shape: Any, path: str) -> tuple[int, int]:
    """Check a one-tensor safetensors file against its map; return its data's (start, end).

    ``start``/``end`` are offsets into ``data``. Raises :class:`CodecError` naming ``path``
    when the dtype is unknown, the header is malformed, or shape, dtype and byte count
    disagree.
    """
    known = WIRE_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if known is None:
        raise CodecError(f"unknown tensor dtype {dtype!r}", path=path)
    code, itemsize = known
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CodecError(
            f"tensor shape must be a list of non-negative ints, got {shape!r}", path=path
        )
    if len(data) < 8:
        raise CodecError(f"tensor data of {len(data)} bytes is no safetensors file", path=path)
    (n,) = _U64.unpack_from(data, 0)
    if n > _MAX_HEADER or 8 + n > len(data):
        raise CodecError(
            f"safetensors header length {n} exceeds the {len(data)}-byte data", path=path
        )
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
        entry = header["t"]
        begin, end = entry["data_offsets"]
        st_code, st_shape = entry["dtype"], entry["shape"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CodecError(f"malformed safetensors header ({type(exc).__name__})", path=path) from exc
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in (begin, end)):
        raise CodecError(f"safetensors data_offsets must be ints, got {[begin, end]!r}", path=path)
    if st_code != code:
        raise CodecError(
            f"dtype {dtype!r} disagrees with the safetensors dtype {st_code!r}", path=path
        )
    if st_shape != shape:
        raise CodecError(
            f"shape {shape} disagrees with the safetensors shape {st_shape}", path=path
        )
    nbytes = math.prod(shape) * itemsize
    start, stop = 8 + n + begin, 8 + n + end
    if end - begin != nbytes or stop > len(data) or begin < 0:
        raise CodecError(
            f"tensor {dtype} {shape} needs {nbytes} bytes, safetensors gives offsets "
            f"[{begin}, {end}] in {len(data) - 8 - n} bytes",
            path=path,
        )
    return start, stop


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def wire_dtype_of_code(code: str) -> str | None:
    """The wire dtype name of a safetensors dtype code, or None."""
    return _CODE_TO_WIRE.get(code)
