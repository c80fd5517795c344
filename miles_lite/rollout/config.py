"""What every kind of rollout is configured with: groups, seeds, rewards, oversampling, the
bound on an early stop. :class:`~miles_lite.TextRolloutConfig` and
:class:`~miles_lite.DiffusionRolloutConfig` extend it with their kind's settings and their
engines' (:class:`~miles_lite.engine.EngineConfig`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from miles_lite._core.validate import check_choice, check_int, check_seconds, check_type
from miles_lite.engine.updates import WeightUpdateConfig
from miles_lite.errors import ConfigError

__all__ = ["RolloutConfig", "StalenessPolicy"]


class StalenessPolicy(str, enum.Enum):
    """What becomes of a group lagging more than ``max_staleness``: ``DROP`` it (counted
    in ``rollout/staleness_dropped_groups``), or ``RESUME`` it (its stale samples reset to
    their prompts and generated again; ``rollout/staleness_resumed_groups``). The gate
    that applies it is the trainer's (:class:`~miles_lite.training.staleness.StalenessGate`);
    the policy is a setting of the config, so it lives here."""

    DROP = "drop"
    RESUME = "resume"


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """The settings every rollout shares.

    - ``n_samples_per_prompt``: samples per prompt (a group);
    - ``seed``: base seed; a group's seeds come from (seed, rollout id, group), so two
      rollouts of the same prompts never reuse noise and a given rollout id reproduces
      them (:func:`~miles_lite.rollout.seeds.group_seeds`);
    - ``reward``: the default reward kind (a key of the rollout's reward pools),
      overridden per sample by ``metadata["rm_type"]``; ``group_reward``: a kind scored
      once per whole group (``group_rm``); ``None``: no reward;
    - ``reward_workers``: processes of each reward pool the rollout starts from a
      function; ``reward_timeout_s``: bound on one reward call (its worker is replaced);
    - ``rollout_batch_size``: groups to keep (miles' name); the rollout stops once that
      many passed the filters (``None``: every prompt given); ``over_sampling_batch_size``:
      groups started at a time while more are needed (default: ``rollout_batch_size``);
    - ``stop_timeout_s``: bound on an early stop (aborting in-flight work), in seconds;
    - ``weight_update``: how ``update_weights`` pauses, pushes and flushes
      (:class:`~miles_lite.engine.updates.WeightUpdateConfig`);
    - ``max_staleness``: the most weight updates a kept group's oldest token may lag
      behind the current version when it is handed over (``None``: no bound; 0: only
      groups made entirely by the current weights); ``staleness_policy``: what becomes
      of a group lagging more (:class:`StalenessPolicy`:
      ``drop`` it, or ``resume`` it under the current version).
    """

    n_samples_per_prompt: int = 4
    seed: int = 0
    reward: str | None = None
    group_reward: str | None = None
    reward_workers: int = 1
    reward_timeout_s: float = 300.0
    rollout_batch_size: int | None = None
    over_sampling_batch_size: int | None = None
    stop_timeout_s: float = 10.0
    weight_update: WeightUpdateConfig = field(default_factory=WeightUpdateConfig)
    max_staleness: int | None = None
    staleness_policy: StalenessPolicy = StalenessPolicy.DROP

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(owner, "n_samples_per_prompt", self.n_samples_per_prompt)
        check_int(owner, "seed", self.seed, minimum=0)
        check_int(owner, "reward_workers", self.reward_workers)
        check_seconds(owner, "reward_timeout_s", self.reward_timeout_s)
        for name in ("rollout_batch_size", "over_sampling_batch_size"):
            check_int(owner, name, getattr(self, name), optional=True)
        over, target = self.over_sampling_batch_size, self.rollout_batch_size
        if over is not None and target is not None and over < target:
            raise ConfigError(
                f"{owner}.over_sampling_batch_size ({over}) must be >= rollout_batch_size"
                f" ({target})"
            )
        check_seconds(owner, "stop_timeout_s", self.stop_timeout_s)
        check_type(owner, "weight_update", self.weight_update, WeightUpdateConfig)
        check_int(owner, "max_staleness", self.max_staleness, minimum=0, optional=True)
        check_choice(owner, "staleness_policy", self.staleness_policy, tuple(StalenessPolicy))
        for name in ("reward", "group_reward"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f"{owner}.{name} must be a reward kind (str) or None, got {value!r}"
                )
