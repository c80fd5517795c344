"""Reward pools: one per reward kind, scoring a microgroup per call.

- :class:`RewardPool` runs a picklable reward function ``(samples) -> list[float | dict]``
  in worker processes, round-robin. The function is sent to each worker once, when it
  starts (a model it loads stays loaded), by value so that one defined in ``__main__`` or
  a notebook cell works.
- :class:`ApiRewardPool` runs an async remote scorer (:class:`~miles_lite.rewards.ApiScorer`)
  on the event loop, at most ``max_concurrency`` requests in flight.

Both count queue depth as DESIGN.md defines it: at each call, the calls its worker (for an
API pool: the scorer) already had in flight; a call counts until its scores return.
:class:`~miles_lite.pools.dask_pool.DaskRewardPool` runs the same functions on a Dask
cluster; both are :class:`~miles_lite.pools.reward_base.RewardPoolBase`, which turns a
failure into a :class:`~miles_lite.errors.RewardError` and checks the scores, once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from miles_lite._core.resources import ResourceState
from miles_lite._core.reward_values import checked_scores
from miles_lite.errors import MilesLiteError, RewardError
from miles_lite.pools.arena import Arena
from miles_lite.pools.arena_pages import ArenaHandle, ArenaTensor
from miles_lite.pools.reward_base import (
    DEFAULT_REWARD_TIMEOUT_S,
    RewardFn,
    RewardPoolBase,
    RewardPoolStatistics,
    call_reward,
    load_reward,
    reward_view,
)
from miles_lite.pools.worker_arena import WorkerArena
from miles_lite.pools.worker_pool import (
    ExecutorFactory,
    PoolWindow,
    PoolWindows,
    WorkerPool,
    process_executor_factory,
)
from miles_lite.types import Sample

__all__ = ["ApiRewardPool", "RemoteScorer", "RewardPool"]


# This worker process's reward function and arena view, set by _install when it starts,
# or why the function could not be installed (reported by _load_error, raised at start).
_REWARD_FN: RewardFn | None = None
_ARENA: WorkerArena | None = None
_LOAD_ERROR: str | None = None


def _install(index: int, blob: bytes, handle: ArenaHandle | None) -> None:
    global _REWARD_FN, _ARENA, _LOAD_ERROR
    if handle is not None:
        _ARENA = WorkerArena(handle, tag=None)
    # Rewards score tensors: import torch now (once, about 1 s) with one thread per worker,
    # rather than inside the first rollout's first call.
    import torch

    torch.set_num_threads(1)
    try:
        fn = load_reward(blob)
    except Exception as exc:
        # Not raised here: an initializer that raises breaks the executor, and the owner
        # would see a bare BrokenProcessPool with the cause buried in the worker's stderr.
        _LOAD_ERROR = (
            str(exc) if isinstance(exc, MilesLiteError) else f"{type(exc).__name__}: {exc}"
        )
        return
    _REWARD_FN = fn


def _load_error() -> str | None:
    return _LOAD_ERROR


def _score(samples: list[Sample]) -> list[Any]:
    if _REWARD_FN is None:
        raise RuntimeError(f"reward worker has no function: {_LOAD_ERROR or 'not installed'}")
    for sample in samples:
        if isinstance(sample.generated_output, ArenaTensor):
            if _ARENA is None:
                raise RuntimeError("a sample refers to an arena this worker is not attached to")
            sample.generated_output = _ARENA.tensor(sample.generated_output)
    return call_reward(_REWARD_FN, samples)


class RewardPool(RewardPoolBase):
    """``workers`` processes scoring with ``fn``; use as ``async with RewardPool(...)``.

    ``fn`` is pickled once (cloudpickle) and installed in every worker when it starts.
    With ``arena`` (a parser pool's), workers attach to it and outputs lying in it reach
    them without a copy. Samples without tensors (text rollouts) are scored as they are.

    ``timeout_s`` bounds one call (seconds, default 300): a reward still running then has
    its worker killed and replaced, and the call raises :class:`RewardError` naming the
    timeout, so a hung reward never hangs the rollout.
    """

    _resource_name = "reward pool"
    _timeout_action = "its worker was replaced"

    def __init__(
        self,
        name: str,
        fn: RewardFn,
        *,
        workers: int = 1,
        executor_factory: ExecutorFactory | None = None,
        start_method: str = "forkserver",
        arena: Arena | None = None,
        timeout_s: float = DEFAULT_REWARD_TIMEOUT_S,
    ) -> None:
        super().__init__(name, fn, timeout_s=timeout_s)
        self.arena = arena
        blob = self._blob
        handle = arena.handle if arena is not None else None
        self._pool = WorkerPool(
            f"reward:{name}",
            workers=workers,
            executor_factory=executor_factory or process_executor_factory(start_method),
            initializer=_install,
            initargs_for=lambda _i: (blob, handle),
        )

    def _describe(self) -> str:
        return f"reward pool {self.name!r}"

    async def start(self) -> None:
        """Open the pool (as ``async with`` does) unless it is open: start the workers
        (about 1 s each when the function imports torch) and check that each installed
        the function (a model-backed reward loads it then).

        Raises :class:`RewardError` with the cause, in one message, when the function
        cannot be unpickled or its ``load()`` fails (a checkpoint path that does not
        exist); the workers are stopped then.
        """
        if self.state is ResourceState.NEW:
            await self.__aenter__()
        self._check_open()

    async def _open(self) -> None:
        await self._pool.start()
        for index in range(self._pool.workers):
            error = await self._pool.run_on(index, _load_error)
            if error is not None:
                await self._pool.aclose()
                raise RewardError(f"reward {self.name!r} ({self._fn_name}) could not load: {error}")

    async def _close(self) -> None:
        """Stop the workers."""
        await self._pool.aclose()

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Statistics of the calls made inside the block."""
        return self._pool.measure()

    def statistics(self) -> RewardPoolStatistics:
        """A snapshot of the pool's counters (crashes: every worker death, also while
        starting a replacement)."""
        pool = self._pool.statistics()
        base = super().statistics()
        return RewardPoolStatistics(
            calls=base.calls,
            failures=base.failures,
            crashes=pool.crashes,
            timeouts=base.timeouts,
            tensor_bytes_sent=base.tensor_bytes_sent,
            in_flight=sum(pool.in_flight),
        )

    def _views(self, samples: list[Sample]) -> list[Sample]:
        return [reward_view(s, self.arena) for s in samples]

    async def _call(
        self,
        views: list[Sample],
        samples: list[Sample],
        on_worker: Callable[[int], None] | None,
    ) -> list[Any]:
        worker = self._pool.pick()
        if on_worker is not None:
            on_worker(worker)
        # The samples stay referenced until a cancelled call ends: the worker reads them.
        return await self._pool.run_on(
            worker, _score, views, after_cancel=_Keep(samples), timeout_s=self.timeout_s
        )


class RemoteScorer(Protocol):
    """What :class:`ApiRewardPool` needs of a remote scorer (an
    :class:`~miles_lite.rewards.ApiScorer`)."""

    async def score(self, samples: list[Sample]) -> list[Any]:
        """One score per sample, in order; RewardError on failure."""
        ...


class ApiRewardPool:
    """A remote scorer used as a reward pool (``scorer.score`` on the event loop).

    ``scorer`` is an :class:`~miles_lite.rewards.ApiScorer` (or anything with an async
    ``score(samples)``); it bounds its own concurrency and raises :class:`RewardError`
    (an ApiScorer translates its HTTP failures into it). This wrapper counts the queue
    depth and checks the scores (:func:`~miles_lite.rewards.values.checked_scores`).
    Not closed by this wrapper.
    """

    def __init__(self, name: str, scorer: RemoteScorer) -> None:
        self.name = name
        self.scorer = scorer
        self._in_flight = 0
        self._windows = PoolWindows()

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Statistics of the calls made inside the block."""
        return self._windows.measure()

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """Score ``samples`` with one remote call; RewardError on failure."""
        self._windows.dispatched(self._in_flight)
        self._in_flight += 1
        try:
            scores = await self.scorer.score(samples)
        finally:
            self._in_flight -= 1
        return checked_scores(self.name, scores, samples)


class _Keep:
    """An ``after_cancel`` that only holds ``samples`` alive until a late call ends."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def __call__(self, _result: object) -> None:
        self.samples = []
