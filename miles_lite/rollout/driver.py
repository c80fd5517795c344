"""The rollout driver every kind of rollout runs on.

Prompt groups come in; each group is cut into units of work (a microgroup for diffusion,
one sample for text), and workers in one anyio task group run them: generate, then score
at once in a reward pool. A worker that ends a unit takes the next one handed out, or
waits idle for it; a new worker starts only when none is idle, so there are never more
workers than units running at once, and a unit costs a hand-over, not a task (an anyio
task, with its cancel scope, event and wrapper coroutine, costs four times an asyncio
one). The per-engine in-flight bound is the router's (a unit waits for a free engine slot
inside its generate function), so it holds across rollouts sharing the engines. Once a
group is whole, ``group_reward`` scores it and the dynamic filters keep or drop it, with a
reason.

Oversampling and early stop (miles' ``rollout_batch_size`` / ``over_sampling_batch_size``):
groups start in batches while fewer than ``target`` are kept or running; once ``target``
groups are kept the rollout stops. Units not yet started are never sent; the kind's
``abort`` hook stops what is in flight at the engines (text: ``/abort_request``), and,
for kinds that drain, the units still generating come back with their partial output;
everything else (rewards of unneeded work included) is cancelled, not awaited. The
whole stop is shielded and bounded by ``stop_timeout_s``: an engine that never answers
does not stall it. Groups started but not finished are returned as ``partial``.

Every ``run`` has its own :class:`~miles_lite.rollout.context.RunContext` (rollout id,
stop signal, requests in flight), so runs may overlap on one driver: an early stop of
one aborts only its own requests.

:class:`~miles_lite.rollout.hooks.RunHooks` let a consumer of kept groups (a trainer streaming them,
:mod:`miles_lite.training.stream`) take part in one run: it admits each group start
(backpressure), hears of each group's end, holds the run open while it still has kept
groups to judge, and, through a :class:`~miles_lite.rollout.hooks.RunHandle`, wakes the scheduler, refuses a kept
group (dropped, or started again) or asks for the early stop.
"""

from __future__ import annotations

from collections.abc import Sequence

from miles_lite.rollout.context import RunContext
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.hooks import RunHooks
from miles_lite.rollout.kind import RolloutKind
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.run_state import RunState
from miles_lite.rollout.scoring import Scorer
from miles_lite.types import Sample

__all__ = ["Driver", "RolloutKind"]


class Driver:
    """Runs rollouts of one kind (see the module docstring).

    ``filters`` are applied in order to each whole group (the first drop wins);
    ``progress`` shows a tqdm bar counted in samples; ``stop_timeout_s`` bounds an early
    stop (abort at the engines and drain), in seconds. ``max_started_samples`` bounds the
    samples of the groups started and not yet done (``None``: start every group at once);
    a group always starts when none runs. The rollouts set it to twice what their engines
    take at once: starting 4,096 unit tasks in one go stalls the event loop for a second
    while each runs its first step, and gains nothing, since they would wait for a slot.
    """

    def __init__(
        self,
        kind: RolloutKind,
        scorer: Scorer,
        *,
        filters: Sequence[GroupFilter] = (),
        progress: bool = False,
        stop_timeout_s: float = 10.0,
        max_started_samples: int | None = None,
    ) -> None:
        if max_started_samples is not None and max_started_samples < 1:
            raise ValueError(f"max_started_samples must be >= 1, got {max_started_samples}")
        self.kind = kind
        self.scorer = scorer
        self.filters = list(filters)
        self.progress = progress
        self.stop_timeout_s = stop_timeout_s
        self.max_started_samples = max_started_samples
        #: The runs in flight now.
        self.runs: set[RunContext] = set()

    async def run(
        self,
        groups: list[list[Sample]],
        *,
        target: int | None = None,
        batch_size: int | None = None,
        rollout_id: int = 0,
        hooks: RunHooks | None = None,
    ) -> RolloutResult:
        """Run ``groups`` until ``target`` are kept (default: all of them) and return them.

        ``batch_size``: groups started at a time while more are needed (default:
        ``target``). Failures of units, rewards and filters do not raise: their samples
        come back FAILED with a typed error. Cancelling ``run`` aborts the in-flight work
        at the engines (shielded, bounded) and propagates. ``hooks``: a consumer of the
        kept groups taking part in the run (see :class:`~miles_lite.rollout.hooks.RunHooks`).
        """
        run = RunState(
            self, groups, RunContext(rollout_id), target=target, batch_size=batch_size, hooks=hooks
        )
        self.runs.add(run.context)
        try:
            return await run.execute()
        finally:
            self.runs.discard(run.context)
