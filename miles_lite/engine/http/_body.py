"""Reading a response body of unknown length from a transport's stream, piece by piece,
and the checks on the buffer a body of known length is read into (the stream's
``read_into`` fills it).

Each ``read(n)`` returns at most ``n`` bytes already received (aiohttp pauses the socket
above about two read buffers), so the loop never copies more than a few MiB between two
suspension points and never joins a whole body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from miles_lite.engine.http._errors import Progress
from miles_lite.errors import ArenaError, BodyTooLargeError, EngineProtocolError

if TYPE_CHECKING:
    from miles_lite.engine.http.response import BodyBuffer
    from miles_lite.engine.http.transport import ResponseStream

__all__ = ["EXCERPT_BYTES", "read_all_chunks", "read_excerpt", "writable_bytes"]

#: Bytes of a non-2xx answer kept in EngineStatusError.body_excerpt.
EXCERPT_BYTES = 512


def writable_bytes(
    owner: BodyBuffer, nbytes: int, *, url: str | None, request_id: str | None
) -> memoryview:
    """``owner.view`` as a flat byte view of exactly ``nbytes``; ArenaError if unusable."""
    view = owner.view
    where = {"url": url, "request_id": request_id}
    if not isinstance(view, memoryview):
        raise ArenaError(
            f"body allocator returned {type(owner).__name__} whose .view is not a memoryview",
            **where,
        )
    if view.readonly:
        raise ArenaError("body allocator returned a read-only view", **where)
    if view.format != "B" or view.ndim != 1:
        try:
            view = view.cast("B")
        except TypeError as exc:
            raise ArenaError(
                f"body allocator returned a view that is not C-contiguous: {exc}", **where
            ) from exc
    if view.nbytes < nbytes:
        raise ArenaError(
            f"body allocator returned {view.nbytes} bytes for a body of {nbytes} bytes", **where
        )
    return view[:nbytes]


async def read_all_chunks(
    stream: ResponseStream,
    chunk_bytes: int,
    limit: int,
    progress: Progress,
    *,
    url: str | None,
    request_id: str | None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> list[bytes]:
    """The body's pieces until its end, unjoined; ``BodyTooLargeError`` past ``limit`` bytes.
    ``on_chunk`` is given each piece as it arrives."""
    chunks: list[bytes] = []
    while True:
        chunk = await stream.read(chunk_bytes)
        if not chunk:
            return chunks
        progress.received += len(chunk)
        if progress.received > limit:
            raise BodyTooLargeError(
                f"body without Content-Length passed max_body_bytes={limit} after"
                f" {progress.received} bytes: refused; raise the limit or ask for less",
                url=url,
                request_id=request_id,
            )
        chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(chunk)


async def read_excerpt(stream: ResponseStream, progress: Progress) -> str:
    """The first EXCERPT_BYTES of the body, decoded leniently (for error messages).

    A body cut short ends the excerpt early rather than hiding the status behind it.
    """
    got = bytearray()
    while len(got) < EXCERPT_BYTES:
        try:
            chunk = await stream.read(EXCERPT_BYTES - len(got))
        except EngineProtocolError:
            break
        if not chunk:
            break
        got += chunk
        progress.received += len(chunk)
    return got.decode("utf-8", "replace")
