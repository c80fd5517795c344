"""A reward pool on a Dask ``distributed`` cluster, for rewards of tens of milliseconds or
more per call (reward models, code sandboxes) that outgrow the rollout's machine.

:class:`DaskRewardPool` is a drop-in for :class:`~miles_lite.pools.reward_pool.RewardPool`
(same ``score``, ``measure``, ``statistics``; pass it in a rollout's ``rewards=``): the
same function, the same scores, on the cluster's workers. It takes a cluster address
(``tcp://host:8786``: it connects its own client) or a ``concurrent.futures`` executor
handed in (a synchronous ``distributed.Client``'s ``get_executor(pure=False)``).

What changes from local workers:

- **The tensor hand-off.** Local reward workers read a diffusion output in the parser's
  shared-memory arena, by place (zero copy). A remote worker shares no memory with the
  rollout: :func:`~miles_lite.pools.reward_pool.reward_view` still strips what rewards do
  not read (trajectories, debug tensors, log-probs), and the output's bytes travel with
  the call (Dask serialises them). ``statistics().tensor_bytes_sent`` counts them; it is
  0 for a local pool on an arena.
- **The function** travels with each call (pickled once, a few KB for a function; keep
  models out of its state) and is loaded once per worker process, where its ``load()``
  runs, as in a local pool; a worker the cluster restarts loads it again.
- **Per-call cost**: about 8-11 ms of latency and 2-4 ms of CPU (scheduler round trips)
  against 0.2-0.5 ms for a local process pool: worth it from tens of ms per call.
- **Worker death** follows the cluster's ``distributed.scheduler.allowed-failures``: a
  task on a dead worker is run again elsewhere up to that many times (rewards are pure:
  running one twice is harmless), then its call fails with :class:`RewardError` caused by
  :class:`WorkerCrashedError` naming the worker. Other calls go on; the pool stays open.
- **Timeouts** cancel the task at the scheduler, but Dask cannot interrupt a task that
  is running: its worker thread runs on until the function returns.
- **Scheduler loss** (its process killed, its host gone): the client cancels every task
  it had; each call in flight, and each later call while the client is not connected,
  fails with :class:`RewardError` caused by a :class:`WorkerError` naming the scheduler,
  so the rollout fails those samples (counted in ``rollout/failed_samples``) and
  returns. A scheduler back at the same address within the client's timeout
  (``connect_timeout_s``) is used again.

``distributed`` is imported only when a pool connects to an address (``pip install
"dask[distributed]"``, or the ``dask`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import threading
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Executor, Future
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.to_thread

from miles_lite._core.validate import check_seconds
from miles_lite.errors import (
    ConfigError,
    MilesLiteError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
    WorkerTimeoutError,
)
from miles_lite.pools.reward_base import (
    DEFAULT_REWARD_TIMEOUT_S,
    RewardFn,
    RewardPoolBase,
    call_reward,
    load_reward,
)
from miles_lite.pools.worker_pool import PoolWindow, PoolWindows
from miles_lite.types import Sample

__all__ = ["DaskRewardPool"]

#: How long closing waits for the pool's own client to disconnect, in seconds.
_CLOSE_TIMEOUT_S = 10.0
#: How often a waiting call checks that the pool's client still has its scheduler (s).
_LOST_CHECK_S = 0.25

# The reward functions installed in this worker process, by digest of their pickle.
_INSTALLED: dict[str, RewardFn] = {}
_INSTALL_LOCK = threading.Lock()


def _installed(digest: str, blob: bytes) -> RewardFn:
    """The function of ``blob``, unpickled (and ``load()``-ed) once per worker process."""
    fn = _INSTALLED.get(digest)
    if fn is not None:
        return fn
    with _INSTALL_LOCK:  # a worker with several threads: load the model once
        fn = _INSTALLED.get(digest)
        if fn is None:
            fn = _INSTALLED[digest] = load_reward(blob)
    return fn


def score_remote(digest: str, blob: bytes, samples: list[Sample]) -> list[Any]:
    """What runs on a cluster worker: the pool's function over ``samples``."""
    return call_reward(_installed(digest, blob), samples)


class _Dropped(Exception):
    """The cluster cancelled the task (the client lost its scheduler, or it was
    cancelled there): not this task's cancellation."""


class DaskRewardPool(RewardPoolBase):
    """Scores with ``fn`` on a Dask cluster (see the module docstring); use as ``async
    with DaskRewardPool("math", fn, address="tcp://10.0.0.5:8786") as pool``.

    Exactly one of ``address`` (the pool connects its own client when it opens, waits up
    to ``connect_timeout_s`` for the scheduler and one worker, and closes the client with
    the pool) or ``executor`` (not closed by the pool; with Dask, a synchronous client's
    ``get_executor(pure=False)``: ``pure=True`` would hash every batch and merge equal
    ones). ``timeout_s`` bounds one call (seconds).

    Raises :class:`~miles_lite.errors.ConfigError` on bad arguments and
    :class:`~miles_lite.errors.WorkerError` when the cluster cannot be reached on open.
    """

    _resource_name = "Dask reward pool"
    _timeout_action = "its task was cancelled (a running task runs on in its worker)"

    def __init__(
        self,
        name: str,
        fn: RewardFn,
        *,
        address: str | None = None,
        executor: Executor | None = None,
        timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
        connect_timeout_s: float = 30.0,
    ) -> None:
        if (address is None) == (executor is None):
            raise ConfigError(
                "DaskRewardPool needs exactly one of address (a scheduler, tcp://host:port)"
                f" or executor, got address={address!r}, executor={executor!r}"
            )
        if address is not None and not isinstance(address, str):
            raise ConfigError(f"DaskRewardPool.address must be a str, got {address!r}")
        if executor is not None and not isinstance(executor, Executor):
            raise ConfigError(
                f"DaskRewardPool.executor must be a concurrent.futures.Executor, got {executor!r}"
            )
        check_seconds("DaskRewardPool", "connect_timeout_s", connect_timeout_s)
        super().__init__(name, fn, timeout_s=timeout_s)
        self.address = address
        self._connect_timeout_s = connect_timeout_s
        self._digest = hashlib.sha256(self._blob).hexdigest()
        self._executor = executor
        self._client: Any = None
        self._windows = PoolWindows()

    def _describe(self) -> str:
        where = self.address or "an executor"
        return f"Dask reward pool {self.name!r} on {where}"

    async def _open(self) -> None:
        if self.address is None:
            return
        # A synchronous client: its comms run on its own thread, not on this event loop,
        # and cancelling a call cancels its task (an asynchronous client's executor
        # cannot). Made and closed in a thread: both block.
        self._client = await anyio.to_thread.run_sync(
            _connect, self.address, self._connect_timeout_s
        )
        self._executor = self._client.get_executor(pure=False)

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(_CLOSE_TIMEOUT_S, shield=True):
                await anyio.to_thread.run_sync(client.close, abandon_on_cancel=True)

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Statistics of the calls made inside the block. Queue depth: the pool's calls
        already in flight at each call (the cluster, not the pool, picks the worker)."""
        return self._windows.measure()

    async def _call(
        self,
        views: list[Sample],
        samples: list[Sample],
        on_worker: Callable[[int], None] | None,
    ) -> list[Any]:
        """One task on the cluster; on cancellation it is cancelled at the scheduler."""
        executor = self._executor
        if executor is None:  # pragma: no cover - set by _open
            raise ConfigError(f"{self._describe()} has no executor")
        self._windows.dispatched(self._in_flight - 1)
        lost = self._scheduler_lost()
        if lost is not None:
            raise WorkerError(lost)
        future: Future[list[Any]] | None = None
        try:
            # Shielded: a submit abandoned half-way would leave a task nobody cancels.
            # In a thread: the arguments are pickled during submit.
            with anyio.CancelScope(shield=True):
                submitted: Future[list[Any]] = await anyio.to_thread.run_sync(
                    executor.submit, score_remote, self._digest, self._blob, views
                )
            future = submitted
            waiter = _bridge(submitted)
            try:
                with anyio.fail_after(self.timeout_s):
                    return await self._wait(waiter)
            finally:
                if not waiter.done():
                    waiter.cancel()  # nothing is set on it after this call ends
                if not submitted.done():
                    submitted.cancel()  # cancelled or timed out: release it at the scheduler
        except TimeoutError as exc:
            if future is not None and future.cancelled():
                raise WorkerTimeoutError(f"past {self.timeout_s} s") from exc
            raise self._cause(exc) from exc
        except Exception as exc:
            raise self._cause(exc) from exc

    async def _wait(self, waiter: asyncio.Future[list[Any]]) -> list[Any]:
        """The task's scores. Checks the client every ``_LOST_CHECK_S`` meanwhile: once it
        lost the scheduler, a task may never settle (Dask leaves the executor's future
        pending when fetching a finished task's result fails), so the call fails then."""
        while not waiter.done():
            await asyncio.wait((waiter,), timeout=_LOST_CHECK_S)
            lost = self._scheduler_lost()
            if lost is not None and not waiter.done():
                raise WorkerError(lost)
        return waiter.result()

    def _scheduler_lost(self) -> str | None:
        """Why the pool's own client cannot reach its scheduler now, or None."""
        client = self._client
        if client is None:
            return None
        status = str(getattr(client, "status", "running"))
        if status == "running":
            return None
        return (
            f"the connection to the Dask scheduler at {self.address} was lost (the client is"
            f" {status}): is the scheduler running?"
        )

    def _cause(self, exc: Exception) -> MilesLiteError:
        """The typed cause of a failed task (turned into the RewardError by the base)."""
        if isinstance(exc, MilesLiteError):
            return exc
        if _is_crash(exc):
            return WorkerCrashedError(f"a worker died while running it: {exc}")
        lost = self._scheduler_lost()
        if lost is not None:
            return WorkerError(lost)
        if isinstance(exc, _Dropped):
            return WorkerError(
                "the cluster dropped the task (its client lost the scheduler, or it was"
                " cancelled there)"
            )
        return WorkerTaskError(f"{self._fn_name}'s task failed: {type(exc).__name__}: {exc}")


def _bridge(future: Future[list[Any]]) -> asyncio.Future[list[Any]]:
    """An asyncio future settled by ``future`` from the client's thread. Unlike
    ``asyncio.wrap_future``, a task the cluster cancelled (the client lost its scheduler)
    arrives as :class:`_Dropped`, not as a cancellation of the task awaiting it."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[list[Any]] = loop.create_future()

    def settle(done: Future[list[Any]]) -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.set_exception(_Dropped())
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[list[Any]]) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, done)

    future.add_done_callback(on_done)
    return waiter


def _is_crash(exc: BaseException) -> bool:
    """Whether ``exc`` says the worker process died (Dask's ``KilledWorker``, or a broken
    local executor), by type, without importing ``distributed``."""
    if isinstance(exc, BrokenExecutor):
        return True
    return any(
        cls.__name__ == "KilledWorker" and cls.__module__.startswith("distributed")
        for cls in type(exc).__mro__
    )


def _connect(address: str, timeout_s: float) -> Any:
    """A synchronous ``distributed.Client`` of the scheduler at ``address`` with a worker;
    blocking. Raises WorkerError naming the address."""
    try:
        distributed: Any = importlib.import_module("distributed")
    except ImportError as exc:
        raise ConfigError(
            'DaskRewardPool(address=...) needs dask distributed: pip install "dask[distributed]"'
        ) from exc
    try:
        # set_as_default=False: no process-wide default client for other code to pick up.
        client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise WorkerError(
            f"cannot reach the Dask scheduler at {address} within {timeout_s} s: {exc}"
        ) from exc
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except (OSError, TimeoutError) as exc:
        client.close()
        raise WorkerError(
            f"the Dask scheduler at {address} has no worker after {timeout_s} s: start"
            f" some (dask worker {address})"
        ) from exc
    return client
