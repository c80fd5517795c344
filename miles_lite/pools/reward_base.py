"""What every reward pool shares: the function (its name, its pickle, its ``load()``
hook), the counters, the sample views, and the one place a failure becomes a
:class:`~miles_lite.errors.RewardError` and the scores are checked.

:class:`RewardPoolBase` is the base of :class:`~miles_lite.pools.reward_pool.RewardPool`
(local worker processes) and :class:`~miles_lite.pools.dask_pool.DaskRewardPool` (a Dask
cluster); a subclass says only how one call runs (:meth:`RewardPoolBase._call`), raising
a typed cause (:class:`WorkerTaskError`, :class:`WorkerTimeoutError`,
:class:`WorkerCrashedError`, :class:`WorkerError`). On a worker, :func:`call_reward` runs
the user's function and names it in its errors.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle

from miles_lite._core.resources import AsyncResource
from miles_lite._core.reward_values import checked_scores
from miles_lite._core.validate import check_seconds
from miles_lite.errors import (
    MilesLiteError,
    RewardError,
    WorkerCrashedError,
    WorkerTaskError,
    WorkerTimeoutError,
)
from miles_lite.pools.arena import Arena
from miles_lite.pools.worker_pool import PoolWindow
from miles_lite.types import Sample

__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "RewardFn",
    "RewardPoolBase",
    "RewardPoolLike",
    "RewardPoolStatistics",
    "call_reward",
    "load_reward",
    "reward_view",
    "tensor_bytes",
]

RewardFn = Callable[[list[Sample]], list[Any]]

#: Default seconds one reward call may run before it is given up.
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


class RewardPoolLike(Protocol):
    """What the rollout needs of a reward pool."""

    name: str

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """One score per sample, in order; RewardError on failure."""
        ...

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """A context manager collecting a :class:`PoolWindow` of the calls inside it."""
        ...


def tensor_bytes(views: list[Sample]) -> int:
    """The bytes of the tensors in ``views`` (reward views) that a worker gets by value:
    ``generated_output`` unless it is an arena place."""
    total = 0
    for view in views:
        output = view.generated_output
        if output is not None and hasattr(output, "element_size") and hasattr(output, "numel"):
            total += int(output.element_size()) * int(output.numel())
    return total


def reward_view(sample: Sample, arena: Arena | None = None) -> Sample:
    """The sample as a reward function sees it: the trajectory tensors left behind.

    Rewards score the output (``generated_output``), prompt, label and metadata; the
    per-step tensors (often most of the bytes) would only cost pickling time. With an
    ``arena``, a ``generated_output`` lying in it travels as its place (an
    :class:`~miles_lite.pools.arena_pages.ArenaTensor`), not its bytes; the worker views
    the same memory.
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


def function_name(fn: object) -> str:
    """How errors name a reward function: its qualified name, else its type's."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def load_reward(blob: bytes) -> RewardFn:
    """On a worker: the function of ``blob`` (a cloudpickle), its ``load()`` run (a
    model-backed reward such as ClipReward loads its weights then)."""
    fn: RewardFn = cloudpickle.loads(blob)
    load = getattr(fn, "load", None)
    if callable(load):
        load()
    return fn


def call_reward(fn: RewardFn, samples: list[Sample]) -> list[Any]:
    """On a worker: ``fn(samples)`` as a list. A miles_lite error passes unchanged; any
    other is a :class:`WorkerTaskError` naming ``fn`` (not the pool's wrapper), with the
    worker's traceback."""
    try:
        return list(fn(samples))
    except MilesLiteError:
        raise
    except Exception as exc:
        raise WorkerTaskError(
            f"{function_name(fn)} raised {type(exc).__name__}: {exc}",
            remote_traceback=traceback.format_exc(),
        ) from None


@dataclass(slots=True)
class _Counts:
    calls: int = 0
    failures: int = 0
    crashes: int = 0
    timeouts: int = 0
    tensor_bytes_sent: int = 0


class RewardPoolBase(AsyncResource):
    """A reward pool scoring with ``fn`` (see the module docstring); subclasses implement
    :meth:`_call` and :meth:`_describe`.

    ``timeout_s`` bounds one call (seconds): past it the call raises :class:`RewardError`
    naming the timeout and what the pool did (``_timeout_action``).
    """

    #: What happens to a call past its timeout, said in its error.
    _timeout_action = "it was given up"

    def __init__(self, name: str, fn: RewardFn, *, timeout_s: float) -> None:
        super().__init__()
        check_seconds(type(self).__name__, "timeout_s", timeout_s)
        self.name = name
        self.fn = fn
        self.timeout_s = timeout_s
        self._fn_name = function_name(fn)
        self._blob = cloudpickle.dumps(fn)
        self._counts = _Counts()
        self._in_flight = 0

    def measure(self) -> AbstractContextManager[PoolWindow]:
        """Statistics of the calls made inside the block."""
        raise NotImplementedError

    def statistics(self) -> RewardPoolStatistics:
        """A snapshot of the pool's counters."""
        return RewardPoolStatistics(in_flight=self._in_flight, **dataclasses.asdict(self._counts))

    def _views(self, samples: list[Sample]) -> list[Sample]:
        return [reward_view(s) for s in samples]

    async def _call(
        self,
        views: list[Sample],
        samples: list[Sample],
        on_worker: Callable[[int], None] | None,
    ) -> list[Any]:
        """One call of the function over ``views``: its raw scores, or a typed cause."""
        raise NotImplementedError

    async def score(
        self, samples: list[Sample], *, on_worker: Callable[[int], None] | None = None
    ) -> list[float | dict[str, Any]]:
        """Score ``samples`` in one call; one float or dict per sample, in order.
        ``on_worker(index)`` is told which worker got the call, where the pool knows.

        Raises :class:`RewardError`, its cause kept, when the function raises
        (:class:`WorkerTaskError` with the worker's traceback), returns the wrong number
        of scores or a value :func:`~miles_lite.rewards.values.reward_problem` refuses,
        runs past ``timeout_s``, its worker dies (:class:`WorkerCrashedError`) or the
        cluster is lost (:class:`~miles_lite.errors.WorkerError`);
        ``ClosedResourceError`` outside the pool's block. Cancellation propagates.
        """
        self._check_open()
        views = self._views(samples)
        counts = self._counts
        counts.calls += 1
        counts.tensor_bytes_sent += tensor_bytes(views)
        self._in_flight += 1
        try:
            scores = await self._call(views, samples, on_worker)
        except MilesLiteError as exc:
            counts.failures += 1
            raise self._failure(exc) from exc
        finally:
            self._in_flight -= 1
        try:
            return checked_scores(self.name, scores, samples)
        except RewardError:
            counts.failures += 1
            raise

    def _failure(self, cause: MilesLiteError) -> RewardError:
        """The one RewardError of a failed call: the pool, the function, where, the cause."""
        if isinstance(cause, RewardError):
            return cause
        what = f"reward {self.name!r} ({self._fn_name}) on {self._describe()}"
        if isinstance(cause, WorkerTimeoutError):
            self._counts.timeouts += 1
            return RewardError(
                f"{what} did not return within its timeout of {self.timeout_s} s"
                f" ({type(self).__name__} timeout_s); {self._timeout_action}"
            )
        if isinstance(cause, WorkerCrashedError):
            self._counts.crashes += 1
        return RewardError(f"{what} failed: {cause}", url=cause.url, request_id=cause.request_id)
