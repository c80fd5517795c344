"""SGLang's streamed ``/generate`` (``stream: true``): SSE events, cumulative chunks.

Pure, no I/O. Every chunk repeats the whole output so far; the last one before
``data: [DONE]`` carries the finish reason (``captures/gen_stream.txt``); a mid-stream
error is a ``data: {"error": ...}`` event. Chunks are checked by the one answer parser
(:func:`~miles_lite.sglang.generate_wire.parse_generate_answer`, ``in_flight`` for the
chunks before the last), so a streamed answer passes the same checks as a whole one.
"""

from __future__ import annotations

from typing import Any

from miles_lite._core import json as _json
from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.generate_wire import (
    GENERATE_PATH,
    GenerateAnswer,
    decode_generate_answer,
    parse_generate_answer,
)

__all__ = ["StreamEvents", "decode_generate_stream", "parse_stream_chunk"]

_DONE = b"[DONE]"


class StreamEvents:
    """Splits a streamed body, fed piece by piece, into its ``data:`` payloads."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, piece: bytes) -> list[bytes]:
        """The payloads of the events ``piece`` completes (``[DONE]`` included)."""
        buffer = self._pending + piece
        *events, self._pending = buffer.split(b"\n\n")
        return [data for event in events if (data := _data(event)) is not None]


def _data(event: bytes) -> bytes | None:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def _error_of(chunk: Any) -> object:
    return chunk.get("error") if isinstance(chunk, dict) else None


def parse_stream_chunk(
    data: bytes, *, rid: str, url: str | None = None, vocab_size: int | None = None
) -> GenerateAnswer:
    """One chunk's payload, checked: before the last (no finish reason) the tokens so far
    as an ABORTED answer, the last as the answer. :class:`EngineProtocolError` for a chunk
    that is not JSON, an error event (naming its message) or one the parser refuses."""
    where = {"url": url, "request_id": rid}
    try:
        chunk = _json.loads(data)
    except ValueError as exc:
        raise EngineProtocolError(
            f"streamed {GENERATE_PATH} chunk is not JSON: {exc}", **where
        ) from exc
    error = _error_of(chunk)
    if error is not None:
        raise EngineProtocolError(f"streamed {GENERATE_PATH} failed mid-stream: {error!r}", **where)
    meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
    in_flight = isinstance(meta, dict) and meta.get("finish_reason") is None
    return parse_generate_answer(
        chunk, rid=rid, url=url, vocab_size=vocab_size, in_flight=in_flight
    )


def decode_generate_stream(
    body: bytes | bytearray | memoryview,
    *,
    rid: str,
    url: str | None = None,
    vocab_size: int | None = None,
) -> GenerateAnswer:
    """The answer of a whole streamed body: its last chunk, which must carry the finish
    reason and be followed by ``[DONE]`` (:class:`EngineProtocolError` otherwise, or for
    an error event)."""
    where = {"url": url, "request_id": rid}
    events = StreamEvents()
    payloads = events.feed(bytes(body) + b"\n\n")
    if not payloads or payloads[-1] != _DONE:
        raise EngineProtocolError(
            f"streamed {GENERATE_PATH} answer ended without data: [DONE] ({len(payloads)} events)",
            **where,
        )
    chunks = payloads[:-1]
    if not chunks:
        raise EngineProtocolError(f"streamed {GENERATE_PATH} answer has no chunk", **where)
    last = chunks[-1]
    if last.startswith(b'{"error"') or b'"error":' in last[:64]:
        parse_stream_chunk(last, rid=rid, url=url, vocab_size=vocab_size)  # raises it
    return decode_generate_answer(last, rid=rid, url=url, vocab_size=vocab_size)
