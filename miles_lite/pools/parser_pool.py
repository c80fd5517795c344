"""The parser pool: decode diffusion bodies off the event loop, tensors handed over in shared memory.

Two ways in:

- :meth:`ParserPool.parse`: the main process read the body (into :meth:`allocate`'s arena
  lease, so no copy is made); a worker decodes it in place and returns page offsets.
- :meth:`ParserPool.fetch`: ``fetch_in_parser``. The worker posts the request itself,
  reads the body straight into the arena and decodes it there; the body never passes
  through the main process.

Either way the main process gets per-sample maps whose tensors view the arena; they stay
valid while referenced and their pages are reused once they are all gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from miles_lite._core.resources import AsyncResource, ResourceState
from miles_lite.codecs.tensors import materialize
from miles_lite.engine.http.blocking import BlockingRequest
from miles_lite.errors import ConfigError, MilesLiteError
from miles_lite.pools.arena import Arena, ArenaConfig, Lease
from miles_lite.pools.arena_pages import FIRST_WORKER_TAG, LAST_WORKER_TAG
from miles_lite.pools.parser_worker import (
    FetchRequest,
    ParseResult,
    fetch_and_parse,
    init_parser_worker,
    parse_bytes,
    parse_in_arena,
)
from miles_lite.pools.worker_pool import (
    ExecutorFactory,
    WorkerPool,
    process_executor_factory,
)

__all__ = ["ParsedBody", "ParserPool", "ParserPoolConfig"]


@dataclass(frozen=True, kw_only=True)
class ParserPoolConfig:
    """How the parser pool runs.

    ``workers`` processes (miles' ``--rollout-parser-num-workers``); ``arena`` sizes the
    shared memory tensors are handed over in (``None``: no shared memory, tensors are
    pickled back, for executors on other machines; slow); ``align`` moves every tensor to
    a 64-byte boundary in the worker; ``start_method`` for the default executors.

    Usage: ``ParserPoolConfig(workers=4, arena=ArenaConfig(size_bytes=8 << 30))``.
    """

    workers: int = 2
    arena: ArenaConfig | None = field(default_factory=ArenaConfig)
    align: bool = True
    start_method: str = "forkserver"

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= LAST_WORKER_TAG - FIRST_WORKER_TAG + 1:
            raise ConfigError(f"ParserPoolConfig.workers must be in [1, 254], got {self.workers}")
        if self.start_method not in ("forkserver", "spawn"):
            raise ConfigError(
                f"ParserPoolConfig.start_method must be 'forkserver' or 'spawn', got {self.start_method!r}"
            )


@dataclass(slots=True)
class ParsedBody:
    """A decoded body: per-sample maps holding tensors, and when each step ended."""

    #: One map per sample, in the body's order: the SGLang sample's fields by name, its
    #: tensors viewing the arena (or the bytes that came back from the worker).
    items: list[dict[str, Any]]
    wire_bytes: int
    spilled: bool = False
    #: Body and tensor bytes that crossed a worker's pipe (pickled): 0 on the arena path.
    pickled_bytes: int = 0
    response_at: float = 0.0
    read_at: float = 0.0
    parsed_at: float = 0.0
    #: The pool worker that decoded it (a trace's track).
    worker: int = 0


class ParserPool(AsyncResource):
    """Parser workers plus the arena they hand tensors over in.

    Use as ``async with ParserPool(ParserPoolConfig(workers=4)) as parser: ...``; start it
    once and reuse it across rollouts (worker start costs tens of milliseconds, the arena
    a page fault per page). ``executor_factory`` replaces the default process executors.
    """

    _resource_name = "parser pool"

    def __init__(
        self,
        config: ParserPoolConfig | None = None,
        *,
        executor_factory: ExecutorFactory | None = None,
    ) -> None:
        self.config = config or ParserPoolConfig()
        self._executor_factory = executor_factory or process_executor_factory(
            self.config.start_method
        )
        super().__init__()
        self.arena: Arena | None = None
        self._pool: WorkerPool | None = None

    async def start(self) -> None:
        """Open the pool (as ``async with`` does) unless it is open: create the arena and
        start the workers (off the event loop)."""
        if self.state is ResourceState.NEW:
            await self.__aenter__()
        self._check_open()

    async def _open(self) -> None:
        if self.config.arena is not None:
            self.arena = await Arena.create(self.config.arena)
        handle = self.arena.handle if self.arena is not None else None
        self._pool = WorkerPool(
            "parser",
            workers=self.config.workers,
            executor_factory=self._executor_factory,
            initializer=init_parser_worker,
            initargs_for=lambda i: (FIRST_WORKER_TAG + i, handle),
            on_crash=self._reclaim,
        )
        await self._pool.start()  # a failed start closes what opened (AsyncResource)

    @property
    def pool(self) -> WorkerPool:
        """The worker pool; ClosedResourceError unless the parser pool is open."""
        self._check_open()
        assert self._pool is not None  # set whenever the pool is open
        return self._pool

    def measure(self) -> Any:
        """Statistics of the calls dispatched inside the block (see WorkerPool.measure)."""
        return self.pool.measure()

    async def allocate(self, nbytes: int) -> Lease:
        """Arena space for a body the main process will read (a ``BodyAllocator``).

        Waits while the arena is full (backpressure); raises ArenaFullError past
        ``ArenaConfig.wait_s``.
        """
        return await self._arena().lease(nbytes)

    async def parse(
        self,
        body: Lease | bytes,
        content_type: str,
        *,
        url: str | None = None,
        request_id: str | None = None,
    ) -> ParsedBody:
        """Decode a body in a worker. A :class:`Lease` body is decoded in place.

        The lease is consumed: its pages then hold the tensors, or are freed if decoding
        fails. Raises CodecError (with ``url``/``request_id``) on a malformed body,
        WorkerError when the worker fails.
        """
        try:
            worker = self.pool.pick()
            if not isinstance(body, Lease):
                data = bytes(body)
                result: ParseResult = await self.pool.run_on(
                    worker, parse_bytes, data, content_type
                )
                return self._take(result, None, worker, sent_bytes=len(data))
            try:
                result = await self.pool.run_on(
                    worker,
                    parse_in_arena,
                    body.allocation,
                    len(body.array),
                    content_type,
                    self.config.align,
                    after_cancel=lambda _result: body.release(),
                )
            except anyio.get_cancelled_exc_class():
                raise  # the worker may still be reading the lease; after_cancel frees it
            except BaseException:
                body.release()
                raise
            return self._take(result, body, worker)
        except MilesLiteError as exc:
            exc.with_context(url=url, request_id=request_id)
            raise

    async def fetch(
        self, request: BlockingRequest, *, expected_items: int | None = None
    ) -> ParsedBody:
        """``fetch_in_parser``: a worker posts ``request``, reads and decodes the answer
        (``expected_items``: the samples it must hold).

        Raises the engine errors (unavailable, timeout, status, protocol: the worker
        never retries), CodecError, or WorkerError. If cancelled, an answer that still
        arrives is freed.
        """
        arena = self._arena()
        fetch = FetchRequest(
            request,
            expected_items=expected_items,
            align=self.config.align,
            alloc_wait_s=arena.config.wait_s,
        )
        worker = self.pool.pick()
        result: ParseResult = await self.pool.run_on(
            worker, fetch_and_parse, fetch, after_cancel=self._discard
        )
        return self._take(result, None, worker)

    def _take(
        self, result: ParseResult, lease: Lease | None, worker: int, sent_bytes: int = 0
    ) -> ParsedBody:
        pickled = sent_bytes + (len(result.payload) if result.payload is not None else 0)
        if result.payload is not None:
            payload = result.payload
            buffer: Any = payload if isinstance(payload, bytearray) else bytearray(payload)
        elif result.allocation is not None:
            buffer = self._arena().adopt(result.allocation, result.used_bytes).array
        elif lease is not None:
            buffer = self._arena().shrink(lease, result.used_bytes).array
        else:
            raise MilesLiteError("a parse result with neither bytes nor arena space")
        return ParsedBody(
            items=materialize(result.items, buffer),
            wire_bytes=result.wire_bytes,
            spilled=result.spilled,
            pickled_bytes=pickled,
            response_at=result.response_at,
            read_at=result.read_at,
            parsed_at=result.parsed_at,
            worker=worker,
        )

    def _arena(self) -> Arena:
        if self.arena is None:
            raise MilesLiteError("this ParserPool has no arena (ParserPoolConfig.arena=None)")
        return self.arena

    def _discard(self, result: ParseResult | None) -> None:
        if result is not None and result.allocation is not None and self.arena is not None:
            self.arena.discard(result.allocation)

    def _reclaim(self, index: int) -> None:
        if self.arena is not None:
            self.arena.reclaim(FIRST_WORKER_TAG + index)

    async def _close(self) -> None:
        """Stop the workers, then close the arena (tensors still held stay valid)."""
        if self._pool is not None:
            await self._pool.aclose()
        if self.arena is not None:
            await self.arena.aclose()
