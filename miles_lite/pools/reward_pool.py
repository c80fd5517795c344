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
cluster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from miles_lite._core.resources import AsyncResource, ResourceState
from miles_lite._core.validate import check_seconds
from miles_lite.errors import MilesLiteError, RewardError, WorkerTimeoutError
from miles_lite.pools.arena import Arena
from miles_lite.pools.arena_pages import ArenaHandle, ArenaTensor
from miles_lite.pools.worker_arena import WorkerArena
from miles_lite.pools.worker_pool import (
    ExecutorFactory,
    PoolWindow,
    PoolWindows,
    WorkerPool,
    process_executor_factory,
)
from miles_lite.types import Sample

__all__ = [
    "ApiRewardPool",
    "RewardFn",
    "RewardPool",
    "RewardPoolLike",
    "RewardPoolStatistics",
    "checked_scores",
    "reward_view",
    "tensor_bytes",
]

RewardFn = Callable[[list[Sample]], list[Any]]

#: Default seconds one reward call may run before its worker is killed and replaced.
DEFAULT_REWARD_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class RewardPoolStatistics:
    """Counters of a reward pool since it was made (a snapshot).

    ``calls``: score calls; ``failures``: those that raised; ``crashes``: of those, a
    worker died; ``timeouts``: of those, ``timeout_s`` passed; ``tensor_bytes_sent``:
    tensor bytes that travelled to workers with the calls (0 when every output lay in the
    arena: the worker reads it in place); ``in_flight``: calls running now.
    """

    calls: int = 0
    failures: int = 0
    crashes: int = 0
    timeouts: int = 0
    tensor_bytes_sent: int = 0
    in_flight: int = 0


def tensor_bytes(views: list[Sample]) -> int:
    """The bytes of the tensors in ``views`` (reward views) that a worker gets by value:
    ``generated_output`` unless it is an arena place."""
    total = 0
    for view in views:
        output = view.generated_output
        if output is not None and hasattr(output, "element_size") and hasattr(output, "numel"):
            total += int(output.element_size()) * int(output.numel())
    return total


class RewardPoolLike(Protocol):
    """What the rollout needs of a reward pool."""

    name: str

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """One score per sample, in order; RewardError on failure."""
        ...

    def measure(self) -> Any:
        """A context manager collecting a :class:`PoolWindow` of the calls inside it."""
        ...


def reward_view(sample: Sample, arena: Arena | None = None) -> Sample:
    """The sample as a reward function sees it: the trajectory tensors left behind.

    Rewards score the output (``generated_output``), prompt, label and metadata; the
    per-step tensors (often most of the bytes) would only cost pickling time. With an
    ``arena``, a ``generated_output`` lying in it travels as its place (an
    :class:`ArenaTensor`), not its bytes; the worker views the same memory.
    """
    output: Any = sample.generated_output
    if arena is not None and output is not None:
        output = arena.tensor_ref(output) or output
    return dataclasses.replace(
        sample,
        generated_output=output,
        rollout_debug_tensors=None,
        denoising_env=None,
        dit_trajectory=None,
        rollout_log_probs=None,
        error=None,
    )


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
        fn = cloudpickle.loads(blob)
        # A model-backed reward (ClipReward) loads its weights now, at pool start.
        load = getattr(fn, "load", None)
        if callable(load):
            load()
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
    return list(_REWARD_FN(samples))


class RewardPool(AsyncResource):
    """``workers`` processes scoring with ``fn``; use as ``async with RewardPool(...)``.

    ``fn`` is pickled once (cloudpickle) and installed in every worker when it starts.
    With ``arena`` (a parser pool's), workers attach to it and outputs lying in it reach
    them without a copy. Samples without tensors (text rollouts) are scored as they are.

    ``timeout_s`` bounds one call (seconds, default 300): a reward still running then has
    its worker killed and replaced, and the call raises :class:`RewardError` naming the
    timeout, so a hung reward never hangs the rollout.
    """

    _resource_name = "reward pool"

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
        super().__init__()
        check_seconds("RewardPool", "timeout_s", timeout_s)
        self.name = name
        self.fn = fn
        self.arena = arena
        self.timeout_s = timeout_s
        self._counts = dict.fromkeys(("calls", "failures", "timeouts", "tensor_bytes_sent"), 0)
        self._fn_name = getattr(fn, "__qualname__", None) or type(fn).__name__
        blob = cloudpickle.dumps(fn)
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

    def measure(self) -> Any:
        """Statistics of the calls made inside the block."""
        return self._pool.measure()

    def statistics(self) -> RewardPoolStatistics:
        """A snapshot of the pool's counters."""
        pool = self._pool.statistics()
        return RewardPoolStatistics(
            crashes=pool.crashes, in_flight=sum(pool.in_flight), **self._counts
        )

    async def score(
        self, samples: list[Sample], *, on_worker: Callable[[int], None] | None = None
    ) -> list[float | dict[str, Any]]:
        """Score ``samples`` in one worker call; one float or dict per sample, in order.
        ``on_worker(index)`` is told which worker got the call (a trace's track).

        Raises :class:`RewardError` (with the cause) when the function raises, returns the
        wrong number of scores or a NaN/inf, runs past ``timeout_s``, or its worker dies.
        """
        views = [reward_view(s, self.arena) for s in samples]
        counts = self._counts
        counts["calls"] += 1
        counts["tensor_bytes_sent"] += tensor_bytes(views)
        try:
            return await self._score(views, samples, on_worker)
        except RewardError:
            counts["failures"] += 1
            raise

    async def _score(
        self,
        views: list[Sample],
        samples: list[Sample],
        on_worker: Callable[[int], None] | None,
    ) -> list[float | dict[str, Any]]:
        worker = self._pool.pick()
        if on_worker is not None:
            on_worker(worker)
        try:
            # The samples stay referenced until a cancelled call ends: the worker reads them.
            scores = await self._pool.run_on(
                worker, _score, views, after_cancel=_Keep(samples), timeout_s=self.timeout_s
            )
        except WorkerTimeoutError as exc:
            self._counts["timeouts"] += 1
            raise RewardError(
                f"reward {self.name!r} ({self._fn_name}) did not return within its timeout "
                f"of {self.timeout_s} s (RewardPool timeout_s); its worker was replaced"
            ) from exc
        except MilesLiteError as exc:
            # Name the user's function: the pool's own wrapper (_score) means nothing to them.
            message = str(exc).replace("'_score'", repr(self._fn_name))
            raise RewardError(f"reward {self.name!r} ({self._fn_name}) failed: {message}") from exc
        return checked_scores(self.name, scores, samples)


class ApiRewardPool:
    """A remote scorer used as a reward pool (``scorer.score`` on the event loop).

    ``scorer`` is an :class:`~miles_lite.rewards.ApiScorer` (or anything with an async
    ``score(samples)``); it bounds its own concurrency. Not closed by this wrapper.
    """

    def __init__(self, name: str, scorer: Any) -> None:
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
        except RewardError:
            raise
        except MilesLiteError as exc:
            raise RewardError(f"reward {self.name!r} failed: {exc}") from exc
        finally:
            self._in_flight -= 1
        return checked_scores(self.name, list(scores), samples)


class _Keep:
    """An ``after_cancel`` that only holds ``samples`` alive until a late call ends."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def __call__(self, _result: object) -> None:
        self.samples = []


def checked_scores(
    name: str, scores: list[Any], samples: list[Sample]
) -> list[float | dict[str, Any]]:
    """``scores`` of reward ``name`` for ``samples``, checked: one per sample, each a
    finite number or a dict of finite numbers (ints become floats); RewardError if not."""
    if len(scores) != len(samples):
        raise RewardError(
            f"reward {name!r} returned {len(scores)} scores for {len(samples)} samples "
            f"(indices {[s.index for s in samples]})"
        )
    for score, sample in zip(scores, samples, strict=True):
        if isinstance(score, bool) or not isinstance(score, int | float | dict):
            raise RewardError(f"reward {name!r} returned {score!r}; want a float or a dict")
        values = score.values() if isinstance(score, dict) else [score]
        for value in values:
            if isinstance(value, float) and not math.isfinite(value):
                raise RewardError(
                    f"reward {name!r} returned {value!r} for sample {sample.index} "
                    f"(group {sample.group_index}): a reward must be finite",
                    request_id=sample.request_id,
                )
    return [float(s) if not isinstance(s, dict) else s for s in scores]
