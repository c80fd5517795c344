"""A response as the engine sent it, and where its body bytes are written.

The client reads a body chunk by chunk straight into a buffer it asks a
:class:`BodyAllocator` for, so a large body is never joined on the event loop and can land
directly in reused (e.g. shared) memory.
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BodyAllocator",
    "BodyBuffer",
    "FreshBuffer",
    "RawResponse",
    "allocate_fresh",
]


class BodyBuffer(Protocol):
    """Memory a body is written into: ``view`` is writable and at least the body's size.

    The client writes bytes ``[0, nbytes)`` of ``view`` (cast to bytes) and keeps the object
    alive in :attr:`RawResponse.owner`. When a read fails, the client only drops its
    reference; an allocator that must take its memory back should tie that to the object's
    lifetime.
    """

    @property
    def view(self) -> memoryview:
        """A writable, C-contiguous view of at least the requested number of bytes."""
        ...


class BodyAllocator(Protocol):
    """An async callable giving a :class:`BodyBuffer` of at least ``nbytes`` bytes.

    It may wait (backpressure: an arena with no free room); cancellation of the request
    cancels that wait. Whatever it raises reaches the caller of the client unchanged.
    """

    async def __call__(self, nbytes: int, /) -> BodyBuffer:
        """Return a buffer of at least ``nbytes`` bytes; may block until room is free."""
        ...


#: From this size on, fresh buffers are anonymous mappings rather than bytearrays.
_MMAP_THRESHOLD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class FreshBuffer:
    """A newly made buffer as a :class:`BodyBuffer` (the client's default).

    ``data`` is a ``bytearray`` for small bodies, an anonymous ``mmap`` for large ones.
    """

    data: bytearray | mmap.mmap

    @property
    def view(self) -> memoryview:
        """A writable view of the whole buffer."""
        return memoryview(self.data)


async def allocate_fresh(nbytes: int, /) -> FreshBuffer:
    """The default :class:`BodyAllocator`: new zeroed memory of ``nbytes`` bytes.

    Never waits. From 1 MiB on it maps anonymous memory, whose pages the
    kernel supplies on first write: ``bytearray(n)`` would zero all ``n`` bytes at once on
    the event loop (0.1 s per 256 MiB), while the mapping spreads that cost over the body's
    chunks as they arrive. The mapping is unmapped when the buffer is garbage collected.
    Fresh memory still pays the first-touch page faults (about 2 GB/s); pass an allocator
    of reused memory for large bodies.
    """
    if nbytes < _MMAP_THRESHOLD_BYTES:
        return FreshBuffer(bytearray(nbytes))
    return FreshBuffer(mmap.mmap(-1, nbytes))


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A 2xx answer from an engine, with its body unparsed.

    ``url`` is the engine's base URL the request went to, ``status`` the HTTP status,
    ``content_type`` the media type without parameters (``application/msgpack``),
    ``headers`` the response headers (case-insensitive), ``body`` the filled part of the
    buffer, ``owner`` the object that owns the body's memory (what the allocator returned;
    ``None`` for an empty body): keep it referenced as long as ``body`` is used.
    ``request_id`` is the id the caller gave, if any.
    """

    url: str
    status: int
    content_type: str
    headers: Mapping[str, str]
    body: memoryview
    owner: object
    request_id: str | None = None

    @property
    def nbytes(self) -> int:
        """Size of the body in bytes."""
        return self.body.nbytes
