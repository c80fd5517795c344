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

``distributed`` is imported only when a pool connects to an address (``pip install
"dask[distributed]"``, or the ``dask`` extra).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import threading
import traceback
from concurrent.futures import BrokenExecutor, CancelledError, Executor, Future
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.to_thread
import cloudpickle

from miles_lite._core.resources import AsyncResource
from miles_lite._core.validate import check_seconds
from miles_lite.errors import (
    ConfigError,
    MilesLiteError,
    RewardError,
    WorkerCrashedError,
    WorkerError,
    WorkerTaskError,
)
from miles_lite.pools.reward_pool import (
    DEFAULT_REWARD_TIMEOUT_S,
    RewardFn,
    RewardPoolStatistics,
    checked_scores,
    reward_view,
    tensor_bytes,
)
from miles_lite.pools.worker_pool import PoolWindow, PoolWindows
from miles_lite.types import Sample

__all__ = ["DaskRewardPool"]

#: How long closing waits for the pool's own client to disconnect, in seconds.
_CLOSE_TIMEOUT_S = 10.0

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
            fn = cloudpickle.loads(blob)
            load = getattr(fn, "load", None)
            if callable(load):
                load()
            _INSTALLED[digest] = fn
    return fn


def score_remote(digest: str, blob: bytes, samples: list[Sample]) -> list[Any]:
    """What runs on a cluster worker: the pool's function over ``samples``."""
    return list(_installed(digest, blob)(samples))


class DaskRewardPool(AsyncResource):
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
        super().__init__()
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
        check_seconds("DaskRewardPool", "timeout_s", timeout_s)
        check_seconds("DaskRewardPool", "connect_timeout_s", connect_timeout_s)
        self.name = name
        self.fn = fn
        self.address = address
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._fn_name = getattr(fn, "__qualname__", None) or type(fn).__name__
        self._blob = cloudpickle.dumps(fn)
        self._digest = hashlib.sha256(self._blob).hexdigest()
        self._executor = executor
        self._client: Any = None
        self._windows = PoolWindows()
        self._in_flight = 0
        self._counts = dict.fromkeys(
            ("calls", "failures", "crashes", "timeouts", "tensor_bytes_sent"), 0
        )

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

    def statistics(self) -> RewardPoolStatistics:
        """A snapshot of the pool's counters."""
        return RewardPoolStatistics(in_flight=self._in_flight, **self._counts)

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """Score ``samples`` in one task on the cluster; one float or dict per sample.

        Raises :class:`RewardError` (the cause kept) when the function raises
        (:class:`WorkerTaskError` with the remote traceback), returns the wrong number of
        scores or a NaN/inf, runs past ``timeout_s``, or its worker dies
        (:class:`WorkerCrashedError`); ``ClosedResourceError`` outside the pool's block.
        On cancellation the task is cancelled at the scheduler.
        """
        self._check_open()
        executor = self._executor
        if executor is None:  # pragma: no cover - set by _open
            raise ConfigError(f"{self._describe()} has no executor")
        views = [reward_view(s) for s in samples]
        counts = self._counts
        counts["calls"] += 1
        counts["tensor_bytes_sent"] += tensor_bytes(views)
        self._windows.dispatched(self._in_flight)
        self._in_flight += 1
        future: Future[list[Any]] | None = None
        try:
            # Shielded: a submit abandoned half-way would leave a task nobody cancels.
            # In a thread: the arguments are pickled during submit.
            with anyio.CancelScope(shield=True):
                submitted: Future[list[Any]] = await anyio.to_thread.run_sync(
                    executor.submit, score_remote, self._digest, self._blob, views
                )
            future = submitted
            try:
                with anyio.fail_after(self.timeout_s):
                    scores = await asyncio.wrap_future(future)
            finally:
                if not future.done():
                    future.cancel()  # cancelled or timed out: release it at the scheduler
        except Exception as exc:
            counts["failures"] += 1
            error = self._reward_error(exc, future)
            raise error from error.__cause__
        finally:
            self._in_flight -= 1
        return checked_scores(self.name, scores, samples)

    def _reward_error(self, exc: Exception, future: Future[Any] | None) -> RewardError:
        what = f"reward {self.name!r} ({self._fn_name}) on {self._describe()}"
        cause: BaseException
        if isinstance(exc, TimeoutError) and future is not None and future.cancelled():
            self._counts["timeouts"] += 1
            error = RewardError(
                f"{what} did not return within its timeout of {self.timeout_s} s"
                " (DaskRewardPool timeout_s); its task was cancelled (a running task runs"
                " on in its worker)"
            )
            error.__cause__ = exc
            return error
        if _is_crash(exc):
            self._counts["crashes"] += 1
            cause = WorkerCrashedError(f"a worker died while running it: {exc}")
        elif isinstance(exc, CancelledError):
            cause = WorkerError(f"the cluster dropped the task: {exc or type(exc).__name__}")
        elif isinstance(exc, MilesLiteError):
            cause = exc
        else:
            cause = WorkerTaskError(
                f"{self._fn_name} raised {type(exc).__name__}: {exc}",
                remote_traceback="".join(traceback.format_exception(exc)),
            )
        if cause is not exc:
            cause.__cause__ = exc
        error = RewardError(f"{what} failed: {cause}")
        error.__cause__ = cause
        return error


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
