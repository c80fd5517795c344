"""Configuration of diffusion rollouts: frozen keyword-only dataclasses, checked on creation."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from miles_lite._core.validate import check_choice, check_int, check_type
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.errors import ConfigError
from miles_lite.pools.parser_pool import ParserPoolConfig
from miles_lite.rollout.config import RolloutConfig

__all__ = ["DiffusionRolloutConfig", "DiffusionSamplingParams", "TransportMode"]

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
            check_int("DiffusionSamplingParams", name, getattr(self, name), optional=True)
        if self.rollout_sde_type is not None:
            check_choice(
                "DiffusionSamplingParams",
                "rollout_sde_type",
                self.rollout_sde_type,
                ("sde", "cps", "ode"),
            )
        noise = self.rollout_noise_level
        if noise is not None and not (math.isfinite(noise) and noise >= 0):
            raise ConfigError(
                f"DiffusionSamplingParams.rollout_noise_level must be finite and >= 0, got {noise!r}"
            )

    def to_payload(self) -> dict[str, Any]:
        """The request fields, ``None`` ones dropped."""
        return {k: v for k, v in asdict(self).items() if v is not None}


class TransportMode(enum.Enum):
    """How a diffusion body reaches the main process as tensors, resolved once from the
    config: decoded on the loop (``INLINE``), by a parser worker after the main process
    read it into the arena (``POOL``), or fetched and decoded by the worker (``FETCH``)."""

    INLINE = "inline"
    POOL = "pool"
    FETCH = "fetch"


def _default_engines() -> EngineConfig:
    # A diffusion engine generates a few requests at once (its --max-concurrency).
    return EngineConfig(router=RouterConfig(max_inflight_per_engine=4))


@dataclass(frozen=True, kw_only=True)
class DiffusionRolloutConfig(RolloutConfig):
    """How a diffusion rollout is cut into requests and run (and :class:`RolloutConfig`'s
    shared settings).

    - ``microgroup_size``: samples per ``/rollout/generate`` request (its
      ``num_outputs_per_prompt``); the last microgroup of a group may be smaller. Each
      request carries the seed of its first sample; sample ``i`` of a microgroup gets
      ``request seed + i`` (as SGLang-diffusion does);
    - ``sampling``: the request fields;
    - ``engines``: the client's limits and the router's in-flight bound (default: 4
      requests per engine);
    - ``transport``: ``"pool"`` decodes in the parser pool, ``"inline"`` on the event loop
      (zero-copy for msgpack; base64/JSON inline is the slow baseline);
    - ``fetch_in_parser``: the parser worker posts the request and reads the body itself;
      it is busy for the whole generation, so the parser pool gets at least a worker per
      request the engines take at once (``parser.workers`` is then a minimum);
    - ``parser``: the parser pool and its shared-memory arena.

    Usage: ``DiffusionRolloutConfig(n_samples_per_prompt=8, microgroup_size=4)``.
    """

    microgroup_size: int = 2
    sampling: DiffusionSamplingParams = field(default_factory=DiffusionSamplingParams)
    engines: EngineConfig = field(default_factory=_default_engines)
    transport: Transport = "pool"
    fetch_in_parser: bool = False
    parser: ParserPoolConfig = field(default_factory=ParserPoolConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "DiffusionRolloutConfig"
        check_int(owner, "microgroup_size", self.microgroup_size)
        check_type(owner, "sampling", self.sampling, DiffusionSamplingParams)
        check_type(owner, "engines", self.engines, EngineConfig)
        check_type(owner, "parser", self.parser, ParserPoolConfig)
        check_choice(owner, "transport", self.transport, ("pool", "inline"))
        if self.fetch_in_parser and self.transport != "pool":
            raise ConfigError(f"{owner}.fetch_in_parser needs transport='pool'")

    @property
    def mode(self) -> TransportMode:
        """The transport mode these settings mean."""
        if self.fetch_in_parser:
            return TransportMode.FETCH
        return TransportMode.POOL if self.transport == "pool" else TransportMode.INLINE

    def microgroups(self, n_samples: int | None = None) -> list[tuple[int, int]]:
        """``(start, size)`` of each microgroup of a group of ``n_samples`` samples."""
        n = self.n_samples_per_prompt if n_samples is None else n_samples
        return [(s, min(self.microgroup_size, n - s)) for s in range(0, n, self.microgroup_size)]
