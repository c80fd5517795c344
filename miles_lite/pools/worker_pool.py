"""N single-process executors with round-robin dispatch, queue-depth accounting and crash recovery.

Each worker is its own ``concurrent.futures.Executor`` holding one process, so a call can be
sent to a chosen worker, the calls in flight per worker can be counted, and a crashed
worker can be replaced without disturbing the others. The executor is injectable: a
factory ``(initializer, initargs) -> Executor`` of one-process executors
(``ProcessPoolExecutor`` with forkserver by default, or spawn).
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import sys
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from miles_lite.errors import (
    ClosedResourceError,
    ConfigError,
    MilesLiteError,
    WorkerCrashedError,
    WorkerTaskError,
)

__all__ = [
    "ExecutorFactory",
    "PoolWindow",
    "PoolWindows",
    "WorkerPool",
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
            self._open.remove(window)

    def dispatched(self, depth: int) -> None:
        """A call was dispatched to a worker that had ``depth`` calls in flight."""
        for window in self._open:
            window.calls += 1
            window.max_queue_depth = max(window.max_queue_depth, depth)

    def crashed(self) -> None:
        """A worker died."""
        for window in self._open:
            window.crashes += 1


def _init_worker(user_init: Callable[..., None] | None, nice: int, index: int, *args: Any) -> None:
    # The event loop is latency-bound, workers throughput-bound: under contention for the
    # cores, the loop's process is scheduled first.
    if nice:
        os.nice(nice)
    # One thread per worker: N workers on N cores, and no OpenMP pool to hang in.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if user_init is not None:
        user_init(index, *args)


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start worker processes without re-running the user's ``__main__`` in them.

    spawn and forkserver re-import the parent's main script in every worker (and in the
    fork server): a script without an ``if __name__ == "__main__"`` guard would start a
    rollout in each worker, and one that imports torch makes every worker pay 1 s.
    Workers never need it: functions from ``__main__`` travel by value (cloudpickle).
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _ping() -> int:
    return os.getpid()


@functools.lru_cache(maxsize=64)
def _load_by_value(blob: bytes) -> Callable[..., Any]:
    import cloudpickle

    fn: Callable[..., Any] = cloudpickle.loads(blob)
    return fn


def _call_by_value(blob: bytes, *args: Any) -> Any:
    return _load_by_value(blob)(*args)


def _portable(fn: Callable[..., T]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``fn`` itself if a worker can import it, else ``fn`` pickled by value.

    Functions from ``__main__`` (scripts, notebook cells), lambdas and closures cannot be
    imported by a worker; cloudpickle sends their code instead.
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        import cloudpickle

        return _call_by_value, (cloudpickle.dumps(fn),)
    return fn, ()


class WorkerPool:
    """``workers`` single-process executors, used round-robin.

    ``initializer(index, *initargs_for(index))`` runs in worker ``index`` when it starts
    (and again in its replacement after a crash). ``on_crash(index)`` runs in the main
    process when worker ``index`` is found dead, before it is replaced. Workers run at
    ``nice`` (default +10) so that, when cores are short, the event loop's process runs
    first; they get every idle core all the same.

    Use as ``async with WorkerPool(...) as pool: await pool.run(fn, *args)``.
    """

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
        self._next = 0
        self._windows = PoolWindows()
        self._started = False
        self._closed = False
        self._cold: set[int] = set()
        self.crashes = 0

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every worker and wait until each has run its initializer.

        Worker start is slow (about 1 s for one that imports torch): start pools once and
        reuse them across rollouts. Runs off the event loop.
        """
        if self._closed:
            raise ClosedResourceError(f"pool {self.name!r} is closed")
        if self._started:
            return
        self._executors = [self._make(i) for i in range(self.workers)]
        self._started = True
        await anyio.to_thread.run_sync(self._wait_started)

    def _wait_started(self, indices: list[int] | None = None) -> None:
        chosen = [
            self._executors[i] for i in (indices if indices is not None else range(self.workers))
        ]
        with _main_module_hidden():
            futures = [ex.submit(_ping) for ex in chosen]
        for f in futures:
            f.result()

    def _make(self, index: int) -> Executor:
        return self._factory(
            functools.partial(_init_worker, self._initializer, self._nice, index),
            self._initargs_for(index),
        )

    @property
    def in_flight(self) -> list[int]:
        """Calls in flight per worker now."""
        return list(self._in_flight)

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Collect statistics of the calls dispatched inside the block."""
        return self._windows.measure()

    def pick(self) -> int:
        """The next worker in round-robin order."""
        index = self._next
        self._next = (index + 1) % self.workers
        return index

    async def run(
        self,
        fn: Callable[..., T],
        *args: Any,
        after_cancel: Callable[[T | None], None] | None = None,
    ) -> T:
        """Run ``fn(*args)`` on the next worker (round-robin); see :meth:`run_on`."""
        return await self.run_on(self.pick(), fn, *args, after_cancel=after_cancel)

    async def run_on(
        self,
        index: int,
        fn: Callable[..., T],
        *args: Any,
        after_cancel: Callable[[T | None], None] | None = None,
    ) -> T:
        """Run ``fn(*args)`` on worker ``index`` and return its result.

        Raises the function's own :class:`MilesLiteError` unchanged, any other exception
        as :class:`WorkerTaskError` with the remote traceback, and
        :class:`WorkerCrashedError` when the worker died (it is replaced). On
        cancellation a call that already started runs on; ``after_cancel`` is then called
        (in another thread) when it ends, with its result or None if it failed or never
        ran, to release what the call holds.
        """
        if self._closed:
            raise ClosedResourceError(f"pool {self.name!r} is closed")
        if not self._started:
            await self.start()
        if index in self._cold:
            # A replacement after a crash: start it off the loop before using it.
            self._cold.discard(index)
            await anyio.to_thread.run_sync(self._wait_started, [index])
        executor = self._executors[index]
        depth = self._in_flight[index]
        self._windows.dispatched(depth)
        self._in_flight[index] += 1
        call, extra = _portable(fn)
        future: Future[T] | None = None
        try:
            try:
                future = executor.submit(call, *extra, *args)
                return await asyncio.wrap_future(future)
            except BrokenProcessPool as exc:
                self._replace(index, executor)
                raise WorkerCrashedError(
                    f"worker {index} of pool {self.name!r} died while running "
                    f"{getattr(fn, '__name__', fn)!r}; it was replaced"
                ) from exc
            except MilesLiteError:
                raise
            except Exception as exc:
                cause = exc.__cause__
                raise WorkerTaskError(
                    f"{getattr(fn, '__name__', fn)!r} raised {type(exc).__name__}: {exc} "
                    f"(pool {self.name!r}, worker {index})",
                    remote_traceback=str(cause) if cause is not None else "",
                ) from exc
        finally:
            self._in_flight[index] -= 1
            if future is not None and not future.done() and after_cancel is not None:
                future.add_done_callback(functools.partial(_deliver_late, after_cancel))

    def _replace(self, index: int, broken: Executor) -> None:
        if self._closed or self._executors[index] is not broken:
            return  # already replaced by another call that saw the same crash
        broken.shutdown(wait=False, cancel_futures=True)
        self.crashes += 1
        self._windows.crashed()
        if self._on_crash is not None:
            self._on_crash(index)
        self._executors[index] = self._make(index)
        self._cold.add(index)

    async def aclose(self) -> None:
        """Stop every worker: wait up to 10 s for running calls, then kill. Idempotent."""
        if self._closed:
            return
        self._closed = True
        executors, self._executors = self._executors, []
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE_S):
            await anyio.to_thread.run_sync(_shutdown_all, executors, abandon_on_cancel=True)
        _kill_leftovers(executors)


def _deliver_late(callback: Callable[[Any], None], future: Future[Any]) -> None:
    ok = not future.cancelled() and future.exception() is None
    callback(future.result() if ok else None)


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
