"""Configuration of rollouts: frozen keyword-only dataclasses, checked on creation.

Settings of the parts live beside them: :class:`~miles_lite.engine.EngineClientConfig`,
:class:`~miles_lite.engine.RouterConfig`, :class:`~miles_lite.pools.ParserPoolConfig`,
:class:`~miles_lite.pools.ArenaConfig`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from miles_lite.errors import ConfigError
from miles_lite.sglang.sampling import TextSamplingParams

__all__ = [
    "DiffusionRolloutConfig",
    "DiffusionSamplingParams",
    "TextRolloutConfig",
    "check_batching",
]

SdeType = Literal["sde", "cps", "ode"]
Transport = Literal["pool", "inline"]


@dataclass(frozen=True, kw_only=True)
class DiffusionSamplingParams:
    """The fields of a ``/rollout/generate`` request (SGLang-diffusion), minus prompt and seed.

    ``None`` fields are not sent, so the model's defaults apply. ``rollout=False`` asks
    for an evaluation answer (``generated_output`` only).

    Usage: ``DiffusionSamplingParams(num_inference_steps=8, width=512, height=512)``.
    """

    num_inference_steps: int | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    negative_prompt: str | None = None
    generator_device: str | None = None
    rollout: bool = True
    rollout_sde_type: SdeType | None = None
    rollout_noise_level: float | None = None
    rollout_log_prob_no_const: bool | None = None
    rollout_debug_mode: bool | None = None
    rollout_return_denoising_env: bool | None = True
    rollout_return_dit_trajectory: bool | None = True
    rollout_sde_step_indices: list[int] | None = None
    rollout_return_step_indices: list[int] | None = None
    extra_sampling_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("num_inference_steps", "width", "height", "num_frames", "fps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(
                    f"DiffusionSamplingParams.{name} must be a positive int, got {value!r}"
                )
        if self.rollout_sde_type not in (None, "sde", "cps", "ode"):
            raise ConfigError(
                f"DiffusionSamplingParams.rollout_sde_type must be 'sde', 'cps' or 'ode', "
                f"got {self.rollout_sde_type!r}"
            )
        noise = self.rollout_noise_level
        if noise is not None and not (math.isfinite(noise) and noise >= 0):
            raise ConfigError(
                f"DiffusionSamplingParams.rollout_noise_level must be finite and >= 0, got {noise!r}"
            )

    def to_payload(self) -> dict[str, Any]:
        """The request fields, ``None`` ones dropped."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class DiffusionRolloutConfig:
    """How a diffusion rollout is cut into requests and run.

    - ``n_samples_per_prompt``: samples per prompt (a group); ``microgroup_size``: samples
      per ``/rollout/generate`` request (its ``num_outputs_per_prompt``); the last
      microgroup of a group may be smaller.
    - ``seed``: base seed. A group's seeds come from (seed, rollout id, group), so two
      rollouts of the same prompts never reuse noise and a given rollout id reproduces
      them (:func:`~miles_lite.rollout.seeds.group_seeds`); a prompt may bring its own
      list. Each request carries the seed of its first sample; sample ``i`` of a
      microgroup gets ``request seed + i`` (as SGLang-diffusion does).
    - ``transport``: ``"pool"`` decodes in the parser pool, ``"inline"`` on the event loop
      (zero-copy for msgpack; base64/JSON inline is the slow baseline).
    - ``fetch_in_parser``: the parser worker posts the request and reads the body itself;
      it is busy for the whole generation, so the parser pool needs a worker per request
      in flight (``DiffusionRollout.open`` sizes it so).
    - ``reward``: the default reward kind (a key of the rollout's reward pools), overridden
      per sample by ``metadata["rm_type"]``; ``group_reward``: a kind scored once per
      whole group after its microgroups land (``group_rm``); ``None``: no reward.
    - ``rollout_batch_size``: groups to keep (miles' name); the rollout stops once that
      many passed the filters (``None``: every prompt given). ``over_sampling_batch_size``:
      groups started at a time while more are needed (default: ``rollout_batch_size``).
    - ``stop_timeout_s``: bound on an early stop (cancelling in-flight requests).

    The in-flight bound belongs to the engines (``RouterConfig.max_inflight_per_engine``),
    request limits to the client (``EngineClientConfig.total_timeout_s``,
    ``max_body_bytes``).

    Usage: ``DiffusionRolloutConfig(n_samples_per_prompt=8, microgroup_size=4)``.
    """

    n_samples_per_prompt: int = 4
    microgroup_size: int = 2
    seed: int = 0
    sampling: DiffusionSamplingParams = field(default_factory=DiffusionSamplingParams)
    transport: Transport = "pool"
    fetch_in_parser: bool = False
    reward: str | None = None
    group_reward: str | None = None
    rollout_batch_size: int | None = None
    over_sampling_batch_size: int | None = None
    stop_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check_batching(self)
        for name in ("n_samples_per_prompt", "microgroup_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"DiffusionRolloutConfig.{name} must be an int >= 1, got {value!r}"
                )
        if self.transport not in ("pool", "inline"):
            raise ConfigError(
                f"DiffusionRolloutConfig.transport must be 'pool' or 'inline', got {self.transport!r}"
            )
        if self.fetch_in_parser and self.transport != "pool":
            raise ConfigError("DiffusionRolloutConfig.fetch_in_parser needs transport='pool'")

    def microgroups(self, n_samples: int | None = None) -> list[tuple[int, int]]:
        """``(start, size)`` of each microgroup of a group of ``n_samples`` samples."""
        n = self.n_samples_per_prompt if n_samples is None else n_samples
        return [(s, min(self.microgroup_size, n - s)) for s in range(0, n, self.microgroup_size)]


@dataclass(frozen=True, kw_only=True)
class TextRolloutConfig:
    """How a text rollout runs.

    - ``n_samples_per_prompt``: samples per prompt (a group), each its own request;
    - ``sampling``: default sampling parameters (the generate function gets a copy);
    - ``max_context_len``: the engines' context (prompt + output); a prompt leaving no
      room is never sent (the sample ends TRUNCATED); ``None``: unknown;
    - ``seed``: base of the per-sample ``sampling_seed`` (from seed, rollout id, group);
    - ``reward`` / ``group_reward``: reward kinds as for diffusion; ``reward_key``: the
      entry of a dict reward that filters and metrics read;
    - ``rollout_batch_size`` / ``over_sampling_batch_size`` / ``stop_timeout_s``:
      oversampling and the bound on an early stop, as for diffusion;
    - ``abort_all_on_stop``: on early stop, abort everything on the engines
      (``abort_all``, as miles and slime do); ``False`` when the engines also serve other
      work: then each of this rollout's rids is aborted.

    Usage: ``TextRolloutConfig(n_samples_per_prompt=8, rollout_batch_size=32)``.
    """

    n_samples_per_prompt: int = 4
    sampling: TextSamplingParams = field(default_factory=TextSamplingParams)
    max_context_len: int | None = None
    seed: int = 0
    reward: str | None = None
    group_reward: str | None = None
    reward_key: str | None = None
    rollout_batch_size: int | None = None
    over_sampling_batch_size: int | None = None
    stop_timeout_s: float = 10.0
    abort_all_on_stop: bool = True

    def __post_init__(self) -> None:
        check_batching(self)
        n = self.n_samples_per_prompt
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"TextRolloutConfig.n_samples_per_prompt must be an int >= 1, got {n!r}"
            )
        ctx = self.max_context_len
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
            raise ConfigError(
                f"TextRolloutConfig.max_context_len must be None or an int >= 1, got {ctx!r}"
            )
        if not isinstance(self.sampling, TextSamplingParams):
            raise ConfigError(
                f"TextRolloutConfig.sampling must be a TextSamplingParams, got {self.sampling!r}"
            )


def check_batching(config: Any) -> None:
    """Check the oversampling fields every rollout config shares; ConfigError if wrong."""
    name = type(config).__name__
    for field_name in ("rollout_batch_size", "over_sampling_batch_size"):
        value = getattr(config, field_name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"{name}.{field_name} must be None or an int >= 1, got {value!r}")
    over, target = config.over_sampling_batch_size, config.rollout_batch_size
    if over is not None and target is not None and over < target:
        raise ConfigError(
            f"{name}.over_sampling_batch_size ({over}) must be >= rollout_batch_size ({target})"
        )
    timeout = config.stop_timeout_s
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < math.inf
    ):
        raise ConfigError(f"{name}.stop_timeout_s must be a finite number > 0, got {timeout!r}")
