"""A response as the engine sent it, and where its body bytes are written.

The client reads a body chunk by chunk straight into a buffer it asks a
:class:`BodyAllocator` for, so a large body is never joined on the event loop and can land
directly in reused (e.g. shared) memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BodyAllocator", "BodyBuffer", "BytearrayBuffer", "RawResponse", "allocate_bytearray"]


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


@dataclass(frozen=True, slots=True)
class BytearrayBuffer:
    """A fresh ``bytearray`` as a :class:`BodyBuffer` (the client's default)."""

    data: bytearray

    @property
    def view(self) -> memoryview:
        """A writable view of the whole bytearray."""
        return memoryview(self.data)


async def allocate_bytearray(nbytes: int, /) -> BytearrayBuffer:
    """The default :class:`BodyAllocator`: a new zeroed ``bytearray`` of ``nbytes`` bytes.

    Never waits. A fresh buffer pays the first-touch page faults (about 2 GB/s); pass an
    allocator of reused memory for large bodies.
    """
    return BytearrayBuffer(bytearray(nbytes))


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
