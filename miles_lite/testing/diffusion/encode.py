"""Encode per-sample maps holding torch tensors into either wire form.

What SGLang's diffusion server does when it answers ``/rollout/generate``; used by the
stand-in engine, the benchmarks and the tests. The msgpack form agrees byte for byte with
``captures/rollout_generate_sample.msgpack`` (checked by a test).
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import msgpack
import torch
from safetensors.torch import save

__all__ = ["encode_json_body", "encode_msgpack_body", "encode_msgpack_pieces", "encode_tensor_map"]


def encode_tensor_map(tensor: torch.Tensor, *, base64_text: bool = False) -> dict[str, Any]:
    """The wire map of one tensor: a one-tensor safetensors file named ``t``."""
    data = save({"t": tensor.detach().contiguous()})
    return {
        "__tensor__": True,
        "data": base64.b64encode(data).decode("ascii") if base64_text else data,
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype),
    }


def _encode_tree(value: Any, base64_text: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return encode_tensor_map(value, base64_text=base64_text)
    if isinstance(value, dict):
        return {k: _encode_tree(v, base64_text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode_tree(v, base64_text) for v in value]
    return value


def encode_msgpack_body(items: list[dict[str, Any]]) -> bytes:
    """The ``application/msgpack`` body of SGLang >= 0.5.19."""
    body: bytes = msgpack.packb(_encode_tree(items, False), use_bin_type=True)
    return body


def encode_json_body(items: list[dict[str, Any]]) -> bytes:
    """The ``application/json`` body with base64 tensor data of SGLang <= 0.5.15."""
    return json.dumps(_encode_tree(items, True)).encode()


_ST_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TENSOR_KEYS = [msgpack.packb(k) for k in ("__tensor__", "data", "shape", "dtype")]


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    return b"\xc6" + struct.pack(">I", n)


def _tensor_pieces(tensor: torch.Tensor, out: list[bytes | memoryview]) -> None:
    t = tensor.detach().contiguous()
    code = _ST_CODES.get(t.dtype)
    if code is None:  # rare dtypes: the reference encoder
        out.append(msgpack.packb(encode_tensor_map(t), use_bin_type=True))
        return
    data = t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else memoryview(b"")
    header = json.dumps(
        {"t": {"dtype": code, "shape": list(t.shape), "data_offsets": [0, len(data)]}},
        separators=(",", ":"),
    ).encode()
    header += b" " * (-(8 + len(header)) % 8)
    prefix = struct.pack("<Q", len(header)) + header
    out.append(
        b"\x84"
        + _TENSOR_KEYS[0]
        + b"\xc3"
        + _TENSOR_KEYS[1]
        + _bin_header(len(prefix) + len(data))
        + prefix
    )
    out.append(data)
    out.append(
        _TENSOR_KEYS[2]
        + msgpack.packb(list(t.shape))
        + _TENSOR_KEYS[3]
        + msgpack.packb(str(t.dtype))
    )


def _pieces(value: Any, out: list[bytes | memoryview]) -> None:
    if isinstance(value, torch.Tensor):
        _tensor_pieces(value, out)
    elif isinstance(value, dict):
        out.append(msgpack.Packer().pack_map_header(len(value)))
        for k, v in value.items():
            out.append(msgpack.packb(k, use_bin_type=True))
            _pieces(v, out)
    elif isinstance(value, (list, tuple)):
        out.append(msgpack.Packer().pack_array_header(len(value)))
        for v in value:
            _pieces(v, out)
    else:
        out.append(msgpack.packb(value, use_bin_type=True))


def encode_msgpack_pieces(items: Any) -> list[bytes | memoryview]:
    """The msgpack body of ``items`` as pieces that view the tensors' memory (no copy).

    ``b"".join(pieces) == encode_msgpack_body(items)`` (tested); writing the pieces in
    order sends the body at memory speed instead of the ~0.5 GB/s of the copying encoders.
    The tensors must not change until the pieces are sent.
    """
    out: list[bytes | memoryview] = []
    _pieces(items, out)
    return out
