"""When the text stand-in's requests generate: batch slots, pauses, aborts, token pacing.

At most ``max_running`` requests generate at once; the rest wait for a slot (they count
in ``waiting``). ``/pause_generation`` holds every request at its next token: mode
``abort`` also aborts them all, ``retract`` and ``in_place`` keep them until
``/continue_generation``. As in SGLang, ``retract`` gives up the requests' KV: with the
tiny model, a retracted request is recomputed on continue, unless its KV survived in the
prefix cache (no flush since: it is reused, computed by the old weights); ``in_place``
keeps it. The cache can be flushed (:meth:`Scheduler.can_flush`) only when nothing runs,
or when paused with ``retract``. An aborted request stops at its next token, or leaves
the queue at once, and answers with what it made so far.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from miles_lite.testing.text.stats import TextEngineStats

__all__ = ["ABORT", "PAUSE_MODES", "Call", "Scheduler"]

#: The finish reason of an aborted request, as SGLang gives it.
ABORT: dict[str, Any] = {
    "type": "abort",
    "message": "Aborted",
    "status_code": None,
    "err_type": None,
}
#: What ``/pause_generation`` takes as ``mode``.
PAUSE_MODES = ("abort", "retract", "in_place")


class Call:
    """One prompt generating: its rid, abort flag and the tokens made so far."""

    __slots__ = (
        "aborted",
        "cache_key",
        "cached_tokens",
        "logprobs",
        "out",
        "progress",
        "retracted_at",
        "rid",
    )

    def __init__(self, rid: str, *, streaming: bool = False, cache_key: str | None = None) -> None:
        self.rid = rid
        self.cache_key = cache_key  # the request's extra_key
        self.cached_tokens = 0  # its prompt tokens found in the prefix cache
        # The flush count when a retract pause took its KV; None when it holds its KV.
        self.retracted_at: int | None = None
        self.aborted = anyio.Event()
        self.out: list[int] = []
        # The model policy's log-probs of ``out`` (the scripted one computes its own).
        self.logprobs: list[float] = []
        # Set (and replaced) after each token: what a streaming answer waits on. None
        # when nobody streams: an event per token costs more than making the token.
        self.progress = anyio.Event() if streaming else None

    def advanced(self) -> None:
        """Wake whoever streams this call: a token was made, or it ended."""
        if self.progress is not None:
            self.progress.set()
            self.progress = anyio.Event()


class Scheduler:
    """Batch slots, pause state and abort flags of one engine (see the module docstring).

    ``stats`` gets the ``waiting`` / ``running`` / ``max_running_seen`` counters.
    :meth:`start` makes the slots and the pause event on the engine's event loop.
    """

    def __init__(self, max_running: int, token_latency_s: float, stats: TextEngineStats) -> None:
        self.max_running = max_running
        self.token_latency_s = token_latency_s
        self.stats = stats
        self._calls: set[Call] = set()
        self._slots: anyio.Semaphore | None = None
        self._unpaused: anyio.Event | None = None
        #: The mode of the pause in effect (None when generating).
        self.mode: str | None = None
        #: Cache flushes so far: a retracted request whose KV outlived none is reused.
        self.flushes = 0

    def start(self) -> None:
        """Make the slots and the (set) pause event, on the event loop."""
        self._slots = anyio.Semaphore(self.max_running)
        self._unpaused = anyio.Event()
        self._unpaused.set()

    @property
    def paused(self) -> bool:
        """Whether ``/pause_generation`` holds generation now."""
        return self._unpaused is not None and not self._unpaused.is_set()

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests whose rid starts with ``rid`` (or all); returns how many."""
        count = 0
        for call in list(self._calls):
            if abort_all or (rid is not None and call.rid.startswith(rid)):
                call.aborted.set()
                count += 1
        return count

    def pause(self, mode: str) -> None:
        """Hold generation (one of :data:`PAUSE_MODES`; ``abort`` also aborts all)."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        unpaused = self._started()[1]
        if unpaused.is_set():
            self._unpaused = anyio.Event()
        self.mode = mode
        if mode == "abort":
            self.abort(abort_all=True)
        elif mode == "retract":
            for call in self._calls:
                if call.retracted_at is None:
                    call.retracted_at = self.flushes

    def resume(self) -> None:
        """Let held requests go on (``/continue_generation``)."""
        self.mode = None
        self._started()[1].set()

    def can_flush(self) -> bool:
        """Whether ``/flush_cache`` may flush now (SGLang's ``is_fully_idle``, waiting
        requests ignored while paused): nothing runs, or a ``retract`` pause holds it."""
        if self.paused and self.mode == "retract":
            return True
        return self.stats.running == 0 and self.stats.waiting == 0

    def flushed(self) -> None:
        """The cache was flushed: KV that retracted requests left in it is gone."""
        self.flushes += 1

    def close(self) -> None:
        """End everything: abort all requests and lift any pause (the engine closes)."""
        self.abort(abort_all=True)
        if self._unpaused is not None:
            self._unpaused.set()

    async def run(
        self, call: Call, generate: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Wait for a slot, then ``generate()`` (the finish reason) holding it.

        :data:`ABORT` if ``call`` is aborted while it waits. ``call`` may be aborted
        (:meth:`abort`) from its start to its end.
        """
        slots = self._started()[0]
        self._calls.add(call)
        try:
            self.stats.waiting += 1
            try:
                if slots.value > 0:  # a free slot: no task to watch for aborts
                    slots.acquire_nowait()
                    acquired = True
                else:
                    acquired = await self._wait_for_slot(call, slots)
            finally:
                self.stats.waiting -= 1
            if not acquired:
                return dict(ABORT)
            try:
                self.stats.running += 1
                self.stats.max_running_seen = max(self.stats.max_running_seen, self.stats.running)
                return await generate()
            finally:
                self.stats.running -= 1
                slots.release()
        finally:
            self._calls.discard(call)

    async def pace(self, call: Call) -> bool:
        """Before each token: wait while paused, then ``token_latency_s``; False once
        ``call`` is aborted (an abort is seen at the next token, as SGLang sees it at
        the next step)."""
        while not call.aborted.is_set():
            unpaused = self._started()[1]
            if not unpaused.is_set():
                with anyio.CancelScope() as held:
                    async with anyio.create_task_group() as watch:
                        watch.start_soon(_cancel_on, call.aborted, held)
                        await unpaused.wait()
                        watch.cancel_scope.cancel()
            if self.token_latency_s > 0 and not call.aborted.is_set():
                # A plain sleep costs far less than a cancel scope per token.
                await anyio.sleep(self.token_latency_s)
            if self._started()[1].is_set():
                # Not paused during the sleep either: the token may go (a pause, update
                # and continue that landed in the sleep are seen by the caller's
                # retract check only once the pause has ended).
                break
        return not call.aborted.is_set()

    async def _wait_for_slot(self, call: Call, slots: anyio.Semaphore) -> bool:
        """Wait for a batch slot; False (and no slot held) if the call is aborted first."""
        acquired = False
        with anyio.CancelScope() as waiting:
            async with anyio.create_task_group() as watch:
                watch.start_soon(_cancel_on, call.aborted, waiting)
                await slots.acquire()
                acquired = True
                watch.cancel_scope.cancel()
        return acquired

    def _started(self) -> tuple[anyio.Semaphore, anyio.Event]:
        if self._slots is None or self._unpaused is None:
            raise RuntimeError("the text stand-in's scheduler is used before start()")
        return self._slots, self._unpaused


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
