"""Encode per-sample maps holding torch tensors into either wire form.

What SGLang's diffusion server does when it answers ``/rollout/generate``; used by the
stand-in engine, the benchmarks and the tests. The msgpack form agrees byte for byte with
``captures/rollout_generate_sample.msgpack`` (checked by a test).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgpack
import torch
from safetensors.torch import save

__all__ = ["encode_json_body", "encode_msgpack_body", "encode_tensor_map"]


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
    return msgpack.packb(_encode_tree(items, False), use_bin_type=True)


def encode_json_body(items: list[dict[str, Any]]) -> bytes:
    """The ``application/json`` body with base64 tensor data of SGLang <= 0.5.15."""
    return json.dumps(_encode_tree(items, True)).encode()
