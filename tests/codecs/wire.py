"""Builders of wire bodies (well-formed and deliberately broken) and tensor comparisons."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import msgpack
import numpy as np
import torch

from miles_lite.codecs.body import ALIGNMENT

#: The keys every sample of a rollout answer carries (WIRE.md section 4).
SAMPLE_KEYS = (
    "request_id",
    "prompt",
    "seed",
    "generated_output",
    "rollout_log_probs",
    "rollout_debug_tensors",
    "denoising_env",
    "dit_trajectory",
    "inference_time_s",
    "peak_memory_mb",
)


def safetensors_file(header: Any, data: bytes = b"") -> bytes:
    """A safetensors file with an arbitrary (possibly wrong) JSON ``header``."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def one_tensor_file(code: str, shape: list[int], data: bytes, offsets: Any = None) -> bytes:
    """A one-tensor safetensors file named ``t``; ``offsets`` defaults to the whole ``data``."""
    entry = {"dtype": code, "shape": shape, "data_offsets": offsets or [0, len(data)]}
    return safetensors_file({"t": entry}, data)


def tensor_map(data: Any, shape: Any, dtype: Any) -> dict[str, Any]:
    """A wire tensor map with whatever ``data``, ``shape`` and ``dtype`` it is given."""
    return {"__tensor__": True, "data": data, "shape": shape, "dtype": dtype}


def f32_map(values: list[float], *, base64_text: bool = False) -> dict[str, Any]:
    """A well-formed float32 tensor map of ``values`` (shape ``[len(values)]``)."""
    data = struct.pack(f"<{len(values)}f", *values)
    raw = one_tensor_file("F32", [len(values)], data)
    return tensor_map(
        base64.b64encode(raw).decode() if base64_text else raw, [len(values)], "torch.float32"
    )


def msgpack_body(items: Any) -> bytearray:
    """``items`` packed as msgpack into a writable buffer."""
    return bytearray(msgpack.packb(items, use_bin_type=True))


def json_body(items: Any) -> bytes:
    """``items`` as a JSON body."""
    return json.dumps(items).encode()


def aligned_buffer(body: bytes | bytearray) -> np.ndarray:
    """A writable uint8 array holding ``body`` whose first byte is 64-byte aligned in memory."""
    backing = np.zeros(len(body) + ALIGNMENT, dtype=np.uint8)
    start = -backing.ctypes.data % ALIGNMENT
    out = backing[start : start + len(body)]
    out[:] = np.frombuffer(bytes(body), dtype=np.uint8)
    assert out.ctypes.data % ALIGNMENT == 0
    return out


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor (works for 0-d, empty, bool and bf16)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_tensor(a: Any, b: Any) -> bool:
    """Same dtype, shape and bytes (so NaNs compare equal bit for bit)."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(byte_view(a), byte_view(b))
    )


def same_tree(a: Any, b: Any) -> bool:
    """Structural equality of decoded trees: tensors by bytes, floats bit for bit, types kept."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return same_tensor(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_tree, a, b))
    if isinstance(a, float):
        return isinstance(b, float) and (
            struct.pack(">d", a) == struct.pack(">d", b) or (math.isnan(a) and math.isnan(b))
        )
    return type(a) is type(b) and a == b


def iter_tensors(tree: Any) -> Any:
    """Every tensor in a tree, depth first."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from iter_tensors(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from iter_tensors(v)
