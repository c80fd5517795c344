"""Decode a ``/rollout/generate`` body into per-sample maps whose tensors are :class:`TensorRef`.

Two wire forms, chosen by Content-Type:

- ``application/msgpack`` (SGLang >= 0.5.19): decoded in place, no copy. Each ref points
  into the body itself. With ``align=True`` every tensor's bytes are first moved back to a
  64-byte boundary inside the body (the safetensors header before them is at least 64
  bytes and already read, so the move never touches bytes still needed).
- ``application/json`` with base64 ``data`` (SGLang <= 0.5.15): base64 is decoded into new
  bytes; the refs point into a layout of ``nbytes`` that :meth:`DecodedBody.fill` writes.

Both are pure functions of the body, safe to run in any process; torch is not imported.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miles_lite.codecs.msgpack_reader import Span, read_msgpack
from miles_lite.codecs.tensor_map import TensorRef, is_tensor_map, parse_safetensors
from miles_lite.errors import CodecError

__all__ = [
    "ALIGNMENT",
    "DecodedBody",
    "decode_body",
    "decode_json",
    "decode_msgpack",
    "wire_form",
]

#: Tensors are placed on this byte boundary (a cache line; enough for any dtype and SIMD).
ALIGNMENT = 64


@dataclass(slots=True)
class DecodedBody:
    """Per-sample maps with tensors as :class:`TensorRef`, and where their bytes are.

    ``blobs`` is empty when the refs point into the body itself (msgpack); otherwise each
    ``(offset, bytes)`` must be written at ``offset`` of an ``nbytes`` buffer first
    (:meth:`fill`). ``nbytes`` is the size of the buffer the refs point into.
    """

    items: list[Any]
    nbytes: int
    blobs: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def in_place(self) -> bool:
        """Whether the refs point into the body (nothing to copy)."""
        return not self.blobs

    def fill(self, dest: memoryview) -> None:
        """Write the decoded tensor bytes into ``dest`` (at least ``nbytes`` long)."""
        for offset, blob in self.blobs:
            dest[offset : offset + len(blob)] = blob

    def tensor_bytes(self) -> int:
        """Total bytes of all tensors."""
        total = 0
        for ref in iter_refs(self.items):
            total += ref.nbytes
        return total


def wire_form(content_type: str | None) -> str:
    """``"msgpack"`` or ``"json"`` from a Content-Type header; CodecError otherwise."""
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if ctype in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
        return "msgpack"
    if ctype == "application/json":
        return "json"
    raise CodecError(f"unexpected Content-Type {content_type!r}: want application/msgpack or json")


def decode_body(body: memoryview, content_type: str | None, *, align: bool = False) -> DecodedBody:
    """Decode a body of either wire form (see the module docstring)."""
    if wire_form(content_type) == "msgpack":
        return decode_msgpack(body, align=align)
    return decode_json(body)


def decode_msgpack(body: memoryview, *, align: bool = False) -> DecodedBody:
    """Decode a msgpack body without copying; refs point into ``body``.

    ``align=True`` moves each tensor to a 64-byte offset of ``body`` (which must then be
    writable, and 64-byte aligned in memory for the tensors to be aligned in memory).
    """
    body = body.cast("B") if body.format != "B" else body
    if align and body.readonly:
        raise CodecError("align=True needs a writable body (the tensors are moved in place)")
    top = read_msgpack(body)

    def tensor(value: dict[str, Any], path: str) -> TensorRef:
        data = value.get("data")
        if not isinstance(data, Span):
            raise CodecError(
                f"tensor data must be msgpack bin, got {type(data).__name__}", path=path
            )
        start, stop = parse_safetensors(
            body[data.start : data.stop],
            dtype=value.get("dtype"),
            shape=value.get("shape"),
            path=path,
        )
        offset = data.start + start
        nbytes = stop - start
        if align and offset % ALIGNMENT:
            target = offset - offset % ALIGNMENT
            body[target : target + nbytes] = body[offset : offset + nbytes]
            offset = target
        return TensorRef(offset, nbytes, value["dtype"], tuple(value["shape"]))

    return DecodedBody(items=_items(top, tensor, body), nbytes=len(body))


def decode_json(body: bytes | bytearray | memoryview) -> DecodedBody:
    """Decode a JSON body whose tensor ``data`` is base64 text (or a list of byte values).

    The refs point into a fresh layout: write it with :meth:`DecodedBody.fill`.
    """
    try:
        top = json.loads(body if not isinstance(body, memoryview) else bytes(body))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CodecError(f"malformed JSON body ({type(exc).__name__}: {str(exc)[:200]})") from exc
    blobs: list[tuple[int, bytes]] = []
    cursor = 0

    def tensor(value: dict[str, Any], path: str) -> TensorRef:
        nonlocal cursor
        data = value.get("data")
        if not isinstance(data, str | list):
            raise CodecError(
                f"tensor data is not base64 text (got {type(data).__name__})", path=path
            )
        try:
            raw = base64.b64decode(data, validate=True) if isinstance(data, str) else bytes(data)
        except (binascii.Error, TypeError, ValueError) as exc:
            raise CodecError(f"tensor data is not base64 ({exc})", path=path) from exc
        view = memoryview(raw)
        start, stop = parse_safetensors(
            view, dtype=value.get("dtype"), shape=value.get("shape"), path=path
        )
        nbytes = stop - start
        offset = cursor
        blobs.append((offset, raw[start:stop] if (start, stop) != (0, len(raw)) else raw))
        cursor += -(-nbytes // ALIGNMENT) * ALIGNMENT
        return TensorRef(offset, nbytes, value["dtype"], tuple(value["shape"]))

    items = _items(top, tensor, None)
    return DecodedBody(items=items, nbytes=cursor, blobs=blobs)


def iter_refs(tree: Any) -> Any:
    """Every :class:`TensorRef` in a decoded tree, depth first."""
    if isinstance(tree, TensorRef):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from iter_refs(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from iter_refs(v)


_TensorFn = Callable[[dict[str, Any], str], TensorRef]


def _items(top: Any, tensor: _TensorFn, body: memoryview | None) -> list[Any]:
    if not isinstance(top, list):
        raise CodecError(f"body must be an array of per-sample maps, got {type(top).__name__}")
    out = []
    for i, item in enumerate(top):
        if not isinstance(item, dict):
            raise CodecError(f"sample must be a map, got {type(item).__name__}", path=f"[{i}]")
        out.append(_walk(item, f"[{i}]", tensor, body))
    return out


_MAX_DEPTH = 64


def _walk(value: Any, path: str, tensor: _TensorFn, body: memoryview | None, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise CodecError(f"body nests deeper than {_MAX_DEPTH} levels", path=path)
    if isinstance(value, dict):
        if is_tensor_map(value):
            return tensor(value, path)
        return {k: _walk(v, f"{path}.{k}", tensor, body, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, f"{path}[{i}]", tensor, body, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Span) and body is not None:
        return bytes(body[value.start : value.stop])
    return value
