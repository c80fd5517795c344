"""Turn :class:`TensorRef` trees into torch tensors that view a buffer, without copying."""

from __future__ import annotations

from typing import Any

import torch

from miles_lite.codecs.body import DecodedBody, decode_body
from miles_lite.codecs.tensor_map import TensorRef

__all__ = ["decode_to_tensors", "materialize"]


def materialize(tree: Any, buffer: Any) -> Any:
    """Replace every :class:`TensorRef` in ``tree`` by a tensor viewing ``buffer``.

    ``buffer`` is any object with the buffer protocol; each tensor holds a reference to
    it, so the memory stays valid while any tensor lives. A read-only buffer gives
    tensors that must not be written (torch warns once).
    """
    if isinstance(tree, TensorRef):
        dtype = _DTYPES[tree.dtype]
        if tree.nbytes == 0:
            return torch.empty(tree.shape, dtype=dtype)
        return torch.frombuffer(
            buffer, dtype=dtype, count=tree.nbytes // dtype.itemsize, offset=tree.offset
        ).view(tree.shape)
    if isinstance(tree, dict):
        return {k: materialize(v, buffer) for k, v in tree.items()}
    if isinstance(tree, list):
        return [materialize(v, buffer) for v in tree]
    return tree


def decode_to_tensors(body: bytearray | memoryview, content_type: str | None) -> list[Any]:
    """Decode a whole body in the calling process: per-sample maps holding tensors.

    msgpack tensors view ``body`` (pass a writable buffer to get writable tensors);
    base64/JSON tensors live in one new buffer.
    """
    decoded: DecodedBody = decode_body(memoryview(body), content_type)
    buffer: bytearray | memoryview = body
    if not decoded.in_place:
        buffer = bytearray(decoded.nbytes)
        decoded.fill(memoryview(buffer))
    items: list[Any] = materialize(decoded.items, buffer)
    return items


_DTYPES: dict[str, torch.dtype] = {
    "torch.float64": torch.float64,
    "torch.float32": torch.float32,
    "torch.float16": torch.float16,
    "torch.bfloat16": torch.bfloat16,
    "torch.float8_e4m3fn": torch.float8_e4m3fn,
    "torch.float8_e5m2": torch.float8_e5m2,
    "torch.int64": torch.int64,
    "torch.int32": torch.int32,
    "torch.int16": torch.int16,
    "torch.int8": torch.int8,
    "torch.uint8": torch.uint8,
    "torch.bool": torch.bool,
}
