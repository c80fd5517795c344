"""What runs inside a parser worker: decode bodies in the arena, or fetch them straight into it.

These functions are imported by worker processes and must stay light: no torch import
(tensor views are made in the main process from the page numbers returned here), so a
parser worker starts in tens of milliseconds. The HTTP exchange of ``fetch_in_parser`` is
the engine layer's (:mod:`miles_lite.engine.http.blocking`): this module only gives it arena
memory to read into, and decodes.

A worker's arena attachment and its engine connections live in ``_STATE``, this worker
process's own state, set by :func:`init_parser_worker` when the process starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from miles_lite.codecs.body import decode_body, wire_form
from miles_lite.engine.http.blocking import BlockingClient, BlockingRequest
from miles_lite.errors import ArenaFullError, CodecError, EngineProtocolError, MilesLiteError
from miles_lite.pools.arena_pages import Allocation, ArenaHandle
from miles_lite.pools.worker_arena import WorkerArena

__all__ = ["FetchRequest", "ParseResult", "fetch_and_parse", "init_parser_worker", "parse_in_arena"]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """What a parser worker fetches (``fetch_in_parser``): the engine ``request``, and how
    to take its answer: ``expected_items``, when set, is the number of samples the answer
    must hold (an answer with another count is refused: it cannot be this request's);
    ``align`` moves tensors to 64-byte boundaries; ``alloc_wait_s`` bounds the wait for
    arena room before the body spills to private memory (seconds)."""

    request: BlockingRequest
    expected_items: int | None = None
    align: bool = True
    alloc_wait_s: float = 2.0


@dataclass(slots=True)
class ParseResult:
    """A decoded body: ``items`` hold :class:`TensorRef` s relative to the allocation start.

    ``allocation`` is set when the worker allocated the bytes (the main process adopts
    it); ``used_bytes`` is how much of it the tensors need. Times are ``time.monotonic``
    readings (one clock for all processes on Linux); ``wire_bytes`` is the body size.
    """

    items: list[dict[str, Any]]
    used_bytes: int
    allocation: Allocation | None = None
    #: The arena was full: the body was read into private memory and comes back pickled.
    spilled: bool = False
    wire_bytes: int = 0
    content_type: str = ""
    response_at: float = 0.0
    read_at: float = 0.0
    parsed_at: float = 0.0
    payload: bytes | bytearray | None = field(default=None, repr=False)


class _WorkerState:
    def __init__(self, arena: WorkerArena | None) -> None:
        self.arena = arena
        self.client = BlockingClient()


_STATE: _WorkerState | None = None


def init_parser_worker(index: int, tag: int, handle: ArenaHandle | None) -> None:
    """Attach this worker to the arena (``handle`` None: no shared memory)."""
    global _STATE
    _STATE = _WorkerState(WorkerArena(handle, tag) if handle is not None else None)


def _state() -> _WorkerState:
    if _STATE is None:
        raise RuntimeError("parser worker used before init_parser_worker ran")
    return _STATE


def parse_in_arena(
    allocation: Allocation, nbytes: int, content_type: str, align: bool
) -> ParseResult:
    """Decode a body the main process wrote into ``allocation`` (its first ``nbytes``)."""
    arena = _state().arena
    if arena is None:
        raise RuntimeError("parse_in_arena needs an arena")
    view = arena.view(allocation, nbytes)
    result = _decode_in(view, content_type, align)
    result.wire_bytes = nbytes
    return result


def parse_bytes(body: bytes, content_type: str) -> ParseResult:
    """Decode a body sent through the pipe (no arena: remote executors); slow for big bodies."""
    decoded = decode_body(memoryview(body), content_type)
    if decoded.in_place:
        return ParseResult(decoded.items, len(body), payload=body, wire_bytes=len(body))
    out = bytearray(decoded.nbytes)
    decoded.fill(memoryview(out))
    return ParseResult(decoded.items, decoded.nbytes, payload=bytes(out), wire_bytes=len(body))


def _decode_in(view: memoryview, content_type: str, align: bool) -> ParseResult:
    decoded = decode_body(view, content_type, align=align)
    if not decoded.in_place:
        # base64/JSON: every byte was copied out by json.loads, so the decoded tensors can
        # overwrite the body; they always fit (each base64 map is larger than its padding).
        if decoded.nbytes > len(view):
            raise CodecError(
                f"decoded tensors ({decoded.nbytes} bytes) exceed the body ({len(view)} bytes)"
            )
        decoded.fill(view)
    return ParseResult(decoded.items, decoded.nbytes, parsed_at=time.monotonic())


def fetch_and_parse(fetch: FetchRequest) -> ParseResult:
    """POST ``fetch.request`` to its engine, read the answer into the arena and decode it
    there; the body never passes through the main process. When the arena stays full for
    ``alloc_wait_s``, the body is read into private memory and comes back pickled
    (``spilled``). Raises the engine errors of :mod:`miles_lite.errors` with url and
    request id; frees its allocation on error.
    """
    state = _state()
    arena = state.arena
    if arena is None:
        raise RuntimeError("fetch_and_parse needs an arena")
    request = fetch.request
    where = {"url": request.url, "request_id": request.request_id}
    allocation: Allocation | None = None
    spill: bytearray | None = None

    def allocate(length: int) -> memoryview:
        nonlocal allocation, spill
        try:
            allocation = arena.alloc(length, timeout_s=fetch.alloc_wait_s)
            return arena.view(allocation, length)
        except ArenaFullError:
            spill = bytearray(length)
            return memoryview(spill)

    try:
        answer = state.client.post_into(request, allocate, accept=wire_form)
        result = _decode_in(answer.view, answer.content_type, fetch.align)
        if fetch.expected_items is not None and len(result.items) != fetch.expected_items:
            raise EngineProtocolError(
                f"answer holds {len(result.items)} samples, the request asked for "
                f"{fetch.expected_items}: not this request's answer",
                **where,
            )
    except BaseException as exc:
        if allocation is not None:
            arena.free(allocation)
        if isinstance(exc, MilesLiteError):
            exc.with_context(**where)
        raise
    length = len(answer.view)
    if spill is not None:
        result.payload = spill if result.used_bytes == length else spill[: result.used_bytes]
        result.spilled = True
    result.allocation = allocation
    result.wire_bytes = length
    result.content_type = answer.content_type
    result.response_at = answer.response_at
    result.read_at = answer.read_at
    return result
