"""N single-process executors with least-loaded dispatch, queue-depth accounting and crash recovery.

Each worker is its own ``concurrent.futures.Executor`` holding one process, so a call can be
sent to a chosen worker, the calls in flight per worker can be counted, and a crashed
worker can be replaced without disturbing the others. The executor is injectable: a
factory ``(initializer, initargs) -> Executor`` of one-process executors
(``ProcessPoolExecutor`` with forkserver by default, or spawn; any other
``concurrent.futures.Executor`` works too, e.g. a one-thread ``ThreadPoolExecutor``).

Workers die with the process that owns the pool: each sets a parent-death signal and
watches the owner's pid from a thread, so a SIGKILLed driver leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from miles_lite._core.resources import AsyncResource, ResourceState
from miles_lite.errors import (
    ConfigError,
    MilesLiteError,
    WorkerCrashedError,
    WorkerTaskError,
    WorkerTimeoutError,
)
from miles_lite.pools.worker_process import init_worker, main_module_hidden, ping, portable

__all__ = [
    "ExecutorFactory",
    "PoolWindow",
    "PoolWindows",
    "WorkerPool",
    "WorkerPoolStatistics",
    "process_executor_factory",
]

T = TypeVar("T")

#: ``factory(initializer, initargs) -> Executor`` running one worker process.
ExecutorFactory = Callable[[Callable[..., None], tuple[Any, ...]], Executor]

#: Seconds ``aclose`` waits for workers to finish before killing them.
SHUTDOWN_GRACE_S = 10.0


def process_executor_factory(start_method: str = "forkserver") -> ExecutorFactory:
    """A factory of one-process ``ProcessPoolExecutor`` s using ``start_method``.

    ``forkserver`` (default) or ``spawn``: a child forked after torch ran multi-threaded
    ops hangs, and would inherit the parent's sockets (PERF_FACTS.md). ``fork`` is
    refused for that reason.
    """
    if start_method not in ("forkserver", "spawn"):
        raise ConfigError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    context = multiprocessing.get_context(start_method)

    def factory(initializer: Callable[..., None], initargs: tuple[Any, ...]) -> Executor:
        return ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=initializer, initargs=initargs
        )

    return factory


@dataclass
class PoolWindow:
    """Statistics of a pool over one measured period (one rollout, say).

    ``max_queue_depth``: at each dispatch, the calls the chosen worker already had in
    flight; the maximum over the window. 0 means every dispatch found its worker idle.
    """

    calls: int = 0
    max_queue_depth: int = 0
    crashes: int = 0

    @property
    def ran(self) -> bool:
        """Whether the pool ran any call in this window."""
        return self.calls > 0


class PoolWindows:
    """The measurement windows open on a pool: every dispatch and crash counts in each."""

    def __init__(self) -> None:
        self._open: list[PoolWindow] = []

    @contextmanager
    def measure(self) -> Iterator[PoolWindow]:
        """Collect statistics of the calls dispatched inside the block."""
        window = PoolWindow()
        self._open.append(window)
        try:
            yield window
        finally:
            # By identity: two equal windows (two rollouts sharing the pool) are not the
            # same window, and list.remove would drop the first equal one.
            self._open = [w for w in self._open if w is not window]

    def dispatched(self, depth: int) -> None:
        """A call was dispatched to a worker that had ``depth`` calls in flight."""
        for window in self._open:
            window.calls += 1
            window.max_queue_depth = max(window.max_queue_depth, depth)

    def crashed(self) -> None:
        """A worker died."""
        for window in self._open:
            window.crashes += 1


@dataclass(frozen=True, slots=True)
class WorkerPoolStatistics:
    """A worker pool now: calls ``in_flight`` per worker, and ``crashes``: workers replaced
    (died, or killed past a call's timeout) since the pool started."""

    in_flight: tuple[int, ...]
    crashes: int


class WorkerPool(AsyncResource):
    """``workers`` single-process executors; a call goes to the least loaded worker
    (ties in round-robin order), so a long call (a generation fetched in a worker) never
    queues new work behind it while another worker idles.

    ``initializer(index, *initargs_for(index))`` runs in worker ``index`` when it starts
    (and again in its replacement after a crash). ``on_crash(index)`` runs in the main
    process when worker ``index`` is found dead, before it is replaced. Workers run at
    ``nice`` (default +10) so that, when cores are short, the event loop's process runs
    first; they get every idle core all the same.

    Use as ``async with WorkerPool(...) as pool: await pool.run(fn, *args)`` (or
    :meth:`start` and :meth:`aclose`).
    """

    _resource_name = "worker pool"

    def __init__(
        self,
        name: str,
        *,
        workers: int,
        executor_factory: ExecutorFactory | None = None,
        initializer: Callable[..., None] | None = None,
        initargs_for: Callable[[int], tuple[Any, ...]] | None = None,
        on_crash: Callable[[int], None] | None = None,
        nice: int = 10,
    ) -> None:
        super().__init__()
        if workers < 1:
            raise ConfigError(f"WorkerPool({name!r}): workers must be >= 1, got {workers}")
        self.name = name
        self.workers = workers
        self._factory = executor_factory or process_executor_factory()
        self._initializer = initializer
        self._initargs_for = initargs_for or (lambda _i: ())
        self._on_crash = on_crash
        self._nice = nice
        self._executors: list[Executor] = []
        self._in_flight = [0] * workers
        # A call's slot is given back when the call really ends in its worker (a
        # cancelled call runs on), from the executor's thread: hence the lock. The
        # generation tells a late end on a replaced worker from one on its successor.
        self._count_lock = threading.Lock()
        self._generation = [0] * workers
        self._next = 0
        self._windows = PoolWindows()
        self._cold: set[int] = set()
        # Replaced executors are kept until aclose drops them in a thread: dropping one
        # runs multiprocessing finalizers that write to the resource tracker (blocking).
        self._retired: list[Executor] = []
        self._crashes = 0

    def _describe(self) -> str:
        return f"pool {self.name!r}"

    async def start(self) -> None:
        """Open the pool (as ``async with`` does) unless it is open: start every worker
        and wait until each has run its initializer.

        Worker start is slow (about 1 s for one that imports torch): start pools once and
        reuse them across rollouts. Runs off the event loop. Raises ClosedResourceError
        after :meth:`aclose`.
        """
        if self.state is ResourceState.NEW:
            await self.__aenter__()
        self._check_open()

    async def _open(self) -> None:
        self._executors = [self._make(i) for i in range(self.workers)]
        await anyio.to_thread.run_sync(self._wait_started)

    def statistics(self) -> WorkerPoolStatistics:
        """A snapshot: calls in flight per worker, and workers replaced after a crash or
        a timeout since the pool started."""
        return WorkerPoolStatistics(in_flight=tuple(self._in_flight), crashes=self._crashes)

    def _wait_started(self, indices: list[int] | None = None) -> None:
        chosen = [
            self._executors[i] for i in (indices if indices is not None else range(self.workers))
        ]
        with main_module_hidden():
            futures = [ex.submit(ping) for ex in chosen]
        for f in futures:
            f.result()

    def _make(self, index: int) -> Executor:
        return self._factory(
            functools.partial(init_worker, self._initializer, self._nice, os.getpid(), index),
            self._initargs_for(index),
        )

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Collect statistics of the calls dispatched inside the block."""
        return self._windows.measure()

    def pick(self) -> int:
        """The least loaded worker; among equals, the next in round-robin order."""
        start = self._next
        order = [(start + k) % self.workers for k in range(self.workers)]
        index = min(order, key=lambda i: self._in_flight[i])
        self._next = (index + 1) % self.workers
        return index

    async def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        after_cancel: Callable[[T | None], None] | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """Run ``fn(*args)`` on the least loaded worker (see :meth:`pick`, :meth:`run_on`)."""
        return await self.run_on(
            self.pick(), fn, *args, after_cancel=after_cancel, timeout_s=timeout_s
        )

    async def run_on(
        self,
        index: int,
        fn: Callable[..., T],
        *args: Any,
        after_cancel: Callable[[T | None], None] | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """Run ``fn(*args)`` on worker ``index`` and return its result.

        Raises the function's own :class:`MilesLiteError` unchanged, any other exception
        as :class:`WorkerTaskError` with the remote traceback, and
        :class:`WorkerCrashedError` when the worker died (it is replaced, also when its
        replacement dies while starting). With ``timeout_s``, a call still running then
        gets its worker killed and replaced, and raises :class:`WorkerTimeoutError`.
        On cancellation a call that already started runs on, and still counts as in
        flight on its worker until it ends; ``after_cancel`` is then called (in another
        thread) with its result, or None if it failed or never ran, to release what the
        call holds.
        """
        self._check_open()
        name = getattr(fn, "__name__", repr(fn))
        if index in self._cold:
            await self._warm(index, name)
        executor = self._executors[index]
        depth = self._in_flight[index]
        self._windows.dispatched(depth)
        generation = self._generation[index]
        with self._count_lock:
            self._in_flight[index] += 1
        call, extra = portable(fn)
        future: Future[T] | None = None
        try:
            try:
                future = executor.submit(call, *extra, *args)
                with anyio.fail_after(timeout_s):
                    return await asyncio.wrap_future(future)
            except TimeoutError as exc:
                if future is not None and future.done():
                    # The function's own TimeoutError, not our deadline.
                    raise WorkerTaskError(
                        f"{name!r} raised TimeoutError: {exc} (pool {self.name!r}, worker {index})",
                        remote_traceback=str(exc.__cause__ or ""),
                    ) from exc
                await self._kill(index, executor)
                raise WorkerTimeoutError(
                    f"{name!r} ran past its timeout of {timeout_s} s in worker {index} of "
                    f"pool {self.name!r}; the worker was killed and replaced"
                ) from exc
            except BrokenProcessPool as exc:
                self._replace(index, executor)
                raise WorkerCrashedError(
                    f"worker {index} of pool {self.name!r} died while running "
                    f"{name!r}; it was replaced"
                ) from exc
            except MilesLiteError:
                raise
            except Exception as exc:
                cause = exc.__cause__
                raise WorkerTaskError(
                    f"{name!r} raised {type(exc).__name__}: {exc} "
                    f"(pool {self.name!r}, worker {index})",
                    remote_traceback=str(cause) if cause is not None else "",
                ) from exc
        finally:
            if future is None or future.done():
                self._call_ended(index, generation)
            else:
                # Cancelled while the call runs on: the worker is busy until it ends.
                future.add_done_callback(
                    functools.partial(self._late_end, index, generation, after_cancel)
                )

    async def _warm(self, index: int, name: str) -> None:
        """Start the replacement of a crashed worker off the loop before it is used;
        WorkerCrashedError if it dies while starting (it is replaced again)."""
        self._cold.discard(index)
        executor = self._executors[index]
        try:
            await anyio.to_thread.run_sync(self._wait_started, [index])
        except BrokenProcessPool as exc:
            self._replace(index, executor)
            raise WorkerCrashedError(
                f"the replacement of worker {index} of pool {self.name!r} died while "
                f"starting (before running {name!r}); it was replaced again"
            ) from exc

    async def _kill(self, index: int, executor: Executor) -> None:
        """Kill worker ``index`` (a call ran past its timeout), replace it and wait for
        its processes to end (shielded)."""
        # Kill before replacing: shutdown forgets the executor's processes.
        processes = list((getattr(executor, "_processes", None) or {}).values())
        for proc in processes:
            proc.kill()
        self._replace(index, executor)
        self._retired.append(executor)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_join_all, processes)

    def _call_ended(self, index: int, generation: int) -> None:
        with self._count_lock:
            if self._generation[index] == generation:
                self._in_flight[index] -= 1

    def _late_end(
        self,
        index: int,
        generation: int,
        after_cancel: Callable[[Any], None] | None,
        future: Future[Any],
    ) -> None:
        self._call_ended(index, generation)
        if after_cancel is not None:
            _deliver_late(after_cancel, future)

    def _replace(self, index: int, broken: Executor) -> None:
        if self.closed or self._executors[index] is not broken:
            return  # already replaced by another call that saw the same crash
        broken.shutdown(wait=False, cancel_futures=True)
        with self._count_lock:
            # Calls still counted on the dead worker never end there: start afresh.
            self._generation[index] += 1
            self._in_flight[index] = 0
        self._crashes += 1
        self._windows.crashed()
        if self._on_crash is not None:
            self._on_crash(index)
        self._executors[index] = self._make(index)
        self._cold.add(index)

    async def _close(self) -> None:
        """Stop every worker: wait up to 10 s for running calls, then kill."""
        executors, self._executors = self._executors + self._retired, []
        self._retired = []
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE_S):
            await anyio.to_thread.run_sync(_shutdown_all, executors, abandon_on_cancel=True)
        _kill_leftovers(executors)


def _deliver_late(callback: Callable[[Any], None], future: Future[Any]) -> None:
    ok = not future.cancelled() and future.exception() is None
    callback(future.result() if ok else None)


def _join_all(processes: list[Any]) -> None:
    for proc in processes:
        proc.join(5)


def _shutdown_all(executors: list[Executor]) -> None:
    for ex in executors:
        ex.shutdown(wait=True, cancel_futures=True)


def _kill_leftovers(executors: list[Executor]) -> None:
    # ProcessPoolExecutor keeps its processes in a private dict; a worker stuck past the
    # grace period is killed so that nothing outlives the pool.
    for ex in executors:
        processes = getattr(ex, "_processes", None) or {}
        for proc in list(processes.values()):
            if proc.is_alive():
                proc.kill()
                proc.join(1)
