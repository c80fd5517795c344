"""A rollout composed: the driver (scheduling, early stop), the scorer (rewards), the
filters, and a kind (units, generate, abort, metrics); ``run`` numbers the prompts'
groups and hands them to the driver, ``stream`` hands its kept groups to a trainer as
they finish, ``update_weights`` moves the engines to a new policy version.

:class:`~miles_lite.DiffusionRollout` and :class:`~miles_lite.TextRollout` are built on
it: each brings its kind and its typed context, and an ``open`` that makes the parts.

Why it lives in :mod:`miles_lite.training`, above the driver core: it is the object a
trainer holds, and what it adds to the core is the trainer's side (streaming with
backpressure, the staleness gate, weight updates between steps, the journal it records
into and commits to). The core (:mod:`miles_lite.rollout`) knows none of it.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from miles_lite.engine.router import Router
from miles_lite.engine.updates import WeightUpdateReport
from miles_lite.errors import ConfigError
from miles_lite.pools.reward_base import RewardPoolLike
from miles_lite.rollout.config import RolloutConfig
from miles_lite.rollout.driver import Driver
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.groups import GroupSpec, make_groups
from miles_lite.rollout.kind import RolloutKind
from miles_lite.rollout.result import RolloutResult, warn_if_none_kept
from miles_lite.rollout.scoring import Scorer
from miles_lite.training.staleness import StalenessGate
from miles_lite.training.stream import GroupStream

if TYPE_CHECKING:
    from miles_lite.training.batch import TrainingBatch
    from miles_lite.training.reader import ResumeState
    from miles_lite.training.recorder import RolloutJournal

__all__ = ["Rollout"]

_log = logging.getLogger(__name__)


class Rollout:
    """The parts of a rollout and ``run``: see the module docstring.

    ``router``: the engines (each result names them, so a trace shows idle engines
    too); ``rewards``: reward pools by kind; ``dynamic_filter``: one filter or a list;
    ``progress``: a progress bar in samples; ``max_started_samples``: the driver's bound
    on samples of groups started and not done. Raises ``ConfigError`` when a reward kind
    of the config has no pool.
    """

    #: Whether prompts may be chat ``messages`` lists (text) or only strings (diffusion).
    chat_prompts = True

    def __init__(
        self,
        *,
        config: RolloutConfig,
        router: Router,
        kind: RolloutKind,
        rewards: Mapping[str, RewardPoolLike] | None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None,
        progress: bool,
        max_started_samples: int,
        journal: RolloutJournal | None = None,
    ) -> None:
        self.config = config
        self.router = router
        self.kind = kind
        self.scorer = Scorer(rewards or {}, reward=config.reward, group_reward=config.group_reward)
        filters = [] if dynamic_filter is None else dynamic_filter
        self.journal = journal
        if journal is not None:  # every sample recorded as its generate call ends
            kind = journal.wrap(kind)
        self.driver = Driver(
            kind,
            self.scorer,
            filters=[filters] if callable(filters) else list(filters),
            progress=progress,
            stop_timeout_s=config.stop_timeout_s,
            max_started_samples=max_started_samples,
        )
        self._rollout_ids = itertools.count()

    @property
    def rewards(self) -> dict[str, RewardPoolLike]:
        """The reward pools by kind."""
        return self.scorer.rewards

    def make_groups(self, prompts: Sequence[GroupSpec], rollout_id: int = 0) -> list[list[Any]]:
        """The samples of each prompt, numbered and seeded (see :func:`make_groups`)."""
        config = self.config
        return make_groups(
            prompts,
            n_samples=config.n_samples_per_prompt,
            seed=config.seed,
            rollout_id=rollout_id,
            chat=self.chat_prompts,
        )

    async def run(
        self,
        prompts: Sequence[GroupSpec],
        *,
        rollout_id: int | None = None,
    ) -> RolloutResult:
        """Run one rollout over ``prompts`` and return the kept groups, scored.

        ``rollout_id`` picks the seeds (default: a counter that advances per call, so two
        calls never reuse noise). With ``rollout_batch_size`` the rollout stops once that
        many groups are kept; the others come back in ``result.partial``, ready to resume
        in the next ``run``. Failures of a unit (an engine error, a tool, agent or reward
        that raises, a broken invariant) do not raise: its samples come back FAILED with a
        typed error, the cause kept. Raises ``ConfigError`` before anything is sent when
        ``prompts`` is not a list of prompts (:func:`~miles_lite.rollout.groups.check_prompts`
        names the index). An empty list gives an empty result, logged, with
        ``rollout/prompts`` 0. Cancelling ``run`` stops the engines' work for it.
        Runs may overlap on one rollout: each has its own stop signal and requests.

        With ``max_staleness``, a kept group whose oldest token lags more weight updates
        than that when the run ends (the weights moved on during it) is not returned in
        ``groups``: dropped into ``filtered`` (reason ``stale``), or reset and returned in
        ``partial`` (policy ``resume``).

        ``result.summary()`` says the run in one line of words (groups kept, filtered by
        reason, partial, failed; samples, tokens, seconds). A run that keeps none of the
        groups it was asked for (every group dropped by ``drop_zero_std``, say) warns a
        :class:`~miles_lite.errors.RolloutWarning` with that line.

        Text prompts: a plain string is sent as it is, tokenized without the chat
        template (a base model's completion prompt); a chat ``messages`` list
        (``[{"role": "user", "content": ...}]``) goes through the tokenizer's chat
        template with the generation prompt, as a chat model expects.
        """
        if rollout_id is None:
            rollout_id = next(self._rollout_ids)
        groups = self.make_groups(prompts, rollout_id)
        if not groups:
            _log.warning("run() got no prompts: the result is empty (rollout/prompts = 0)")
        if self.journal is not None:
            self.journal.begin(groups, rollout_id)
        fleet_before = self.router.statistics().fleet
        result = await self.driver.run(
            groups,
            target=self.config.rollout_batch_size,
            batch_size=self.config.over_sampling_batch_size,
            rollout_id=rollout_id,
        )
        result.metrics["rollout/prompts"] = float(len(groups))
        # The fleet's transitions during the run (fenced, catch_ups, ...: fleet/<count>).
        result.metrics.update(self.router.statistics().fleet.metrics_since(fleet_before))
        result.engines = self.router.urls
        result.target = self.config.rollout_batch_size
        result = self._bound_staleness(result)
        if self.journal is not None:  # durable before it is handed over
            await self.journal.hand(rollout_id, result.groups)
            self.journal.end(rollout_id, result)
        warn_if_none_kept(result, stacklevel=2)  # at the caller's await of run()
        return result

    def stream(
        self,
        prompts: Sequence[GroupSpec],
        *,
        max_ahead: int | None = None,
        rollout_id: int | None = None,
    ) -> GroupStream:
        """Stream the kept groups of one run to the trainer as they finish.

        Usage::

            async with rollout.stream(prompts, max_ahead=16) as groups:
                async for group in groups:
                    ...
            groups.result.partial   # for the next call

        ``max_ahead``: groups started and not yet taken by the trainer, at most (default:
        twice ``over_sampling_batch_size`` or ``rollout_batch_size`` when set, else every
        prompt): when the trainer is slow, no more groups start. As :meth:`run`
        otherwise: ``rollout_batch_size`` stops the run once that many were kept (an early
        stop), partial groups come back in ``result.partial``, a group lagging more than
        ``max_staleness`` when the trainer takes it is dropped or started again. Leaving
        the block early stops the run as an early stop does. See
        :mod:`miles_lite.training.stream`.
        """
        if rollout_id is None:
            rollout_id = next(self._rollout_ids)
        config = self.config
        if max_ahead is None:
            batch = config.over_sampling_batch_size or config.rollout_batch_size
            max_ahead = 2 * batch if batch else max(1, len(prompts))
        if isinstance(max_ahead, bool) or not isinstance(max_ahead, int) or max_ahead < 1:
            raise ConfigError(f"max_ahead must be an int >= 1 (groups), got {max_ahead!r}")
        groups = self.make_groups(prompts, rollout_id)
        if self.journal is not None:
            self.journal.begin(groups, rollout_id)
        return GroupStream(
            self.driver,
            groups,
            max_ahead=max_ahead,
            target=config.rollout_batch_size,
            batch_size=config.over_sampling_batch_size,
            rollout_id=rollout_id,
            gate=self._staleness_gate(),
            engines=self.router.urls,
            journal=self.journal,
        )

    async def commit(self, step: int, *, batch: TrainingBatch | None = None) -> None:
        """Mark the groups handed so far as consumed by training step ``step`` (call it
        after the trainer's own checkpoint of that step); ``batch``: the
        :func:`~miles_lite.training.training_batch` trained on, whose digest is journaled
        for replay. Waits until durable. Raises ``ConfigError`` without a journal and
        :class:`~miles_lite.errors.JournalError` when it cannot be written. See
        :mod:`miles_lite.training`."""
        if self.journal is None:
            raise ConfigError("commit() needs a journal: open the rollout with journal=...")
        await self.journal.commit(step, batch)

    async def resume(self) -> ResumeState:
        """Where the journaled run stands (:class:`~miles_lite.training.ResumeState`): the
        last committed step, the groups handed after it (train on them first), the groups
        given and never handed (pass them to the next call) and the prompt ids given.
        Raises ``ConfigError`` without a journal. See :mod:`miles_lite.training`."""
        if self.journal is None:
            raise ConfigError("resume() needs a journal: open the rollout with journal=...")
        return await self.journal.resume()

    async def update_weights(
        self,
        model_path: str | os.PathLike[str] | None,
        *,
        version: str | int,
        check: bool = True,
    ) -> WeightUpdateReport:
        """Move every engine to the weights in ``model_path`` (a ``save_pretrained``
        folder the engines can read) reported as ``version``; ``None``: the trainer pushed
        the weights itself, only the version is bumped.

        Pause (``config.weight_update.mode``, ``retract`` by default), push, flush where
        the mode allows, record the version, continue: requests in flight survive it and
        their samples record which tokens each version made
        (:attr:`Sample.weight_spans <miles_lite.types.Sample.weight_spans>`). Call it
        between training steps or while a rollout runs. An engine that does not take it
        leaves the rotation until it reports the version; ``check`` raises
        :class:`~miles_lite.errors.EngineControlError` naming it (after the others were
        updated and every engine continued). The orchestration is the router's:
        :meth:`Router.update_weights <miles_lite.engine.router.Router.update_weights>`,
        in :mod:`miles_lite.engine.updates` (the order and what is guaranteed).
        """
        return await self.router.update_weights(
            model_path, version=version, config=self.config.weight_update, check=check
        )

    async def add_engine(self, url: str) -> bool:
        """Add the engine at ``url`` while runs go on: probed, brought to the current
        weights and only then sent work (:meth:`Router.add_engine
        <miles_lite.engine.router.Router.add_engine>`). Whether it serves now."""
        return await self.router.add_engine(url)

    async def remove_engine(self, url: str, *, drain: bool = True) -> None:
        """Remove the engine at ``url``: no new work; with ``drain`` its requests finish,
        else they are aborted and come back as partial samples; then it is forgotten
        (:meth:`Router.remove_engine <miles_lite.engine.router.Router.remove_engine>`)."""
        await self.router.remove_engine(url, drain=drain)

    def _staleness_gate(self) -> StalenessGate:
        """A gate of this rollout's bound and policy, over the router's versions (one per
        call: it counts what it refused in that call)."""
        config = self.config
        return StalenessGate(self.router.versions, config.max_staleness, config.staleness_policy)

    def _bound_staleness(self, result: RolloutResult) -> RolloutResult:
        """Refuse the kept groups lagging more than ``max_staleness`` (see :meth:`run`),
        by the same :class:`StalenessGate` a stream uses."""
        gate = self._staleness_gate()
        kept = []
        for group in result.groups:
            verdict = gate.check(group)
            if verdict == "fresh":
                kept.append(group)
            elif verdict == "dropped":
                result.filtered.append(group)
                result.filter_reasons.append("stale")
            else:
                result.partial.append(group)
        result.groups = kept
        result.metrics.update(gate.metrics(kept))
        return result
