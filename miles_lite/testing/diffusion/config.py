"""How a stand-in SGLang diffusion engine behaves: wire form, shapes, latency, warm-up."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["OPTIONAL_GROUPS", "StandInConfig"]

#: The nested groups of a rollout sample that a request may turn off (then they are null).
OPTIONAL_GROUPS = frozenset({"denoising_env", "dit_trajectory", "rollout_debug_tensors"})

_WIRES = ("msgpack", "json")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class StandInConfig:
    """Settings of a :class:`~miles_lite.testing.StandInEngine`.

    Usage: ``StandInConfig(wire="json", step_latency_s=0.01, max_concurrent=2)``.

    Wire and model:
        ``wire``: ``"msgpack"`` answers ``application/msgpack`` with safetensors ``bin``
        data (SGLang >= 0.5.19); ``"json"`` answers ``application/json`` with base64
        text data and no ``sigmas`` in ``dit_trajectory`` (SGLang <= 0.5.15).
        ``model_path`` is reported by ``/model_info``, ``/server_info`` and ``/v1/models``.

    Shapes (defaults reproduce ``captures/rollout_generate_sample.msgpack``):
        ``latent_channels``/``latent_height``/``latent_width`` give the latent of a request
        that names no size; a request's ``width``/``height`` are in pixels, divided by
        ``vae_scale_factor`` to get the latent size, and must be multiples of
        ``vae_scale_factor * patch_size``. ``num_frames`` is the default frame count:
        latents are ``[T+1, C, H, W]`` for one frame and ``[T+1, C, F, H, W]`` for more.
        ``text_seq_len`` x ``text_hidden_size`` is the shape of ``encoder_hidden_states``.
        ``num_inference_steps``, ``num_outputs_per_prompt``, ``guidance_scale`` and
        ``rollout_noise_level`` are the model defaults for requests that omit them.
        ``dtype`` is the dtype of the large tensors (latents, model outputs, images, text
        states); per-step scalars (log-probs, timesteps, sigmas, std devs, guidance) stay
        float32.

    Groups:
        ``default_groups``: which of :data:`OPTIONAL_GROUPS` a rollout request gets when it
        does not say (``rollout_debug_mode``, ``rollout_return_denoising_env``,
        ``rollout_return_dit_trajectory``); an explicit true/false in the request wins.
        ``null_groups=True`` makes every optional group null whatever the request says.

    Timing and load:
        ``step_latency_s`` (seconds) per denoising step: a request takes
        ``num_inference_steps * step_latency_s``, or the time to build its body if longer.
        ``max_concurrent`` requests generate at a time; others wait for a slot.
        ``warmup_s`` (seconds after start): ``/health``, ``/health_generate`` and
        ``/rollout/generate`` answer 503 until then.
        ``max_response_bytes``: a request whose tensors would exceed this many bytes is
        refused with a 400, so a typo cannot exhaust memory.
        ``request_log_limit``: how many received request bodies ``stats.requests`` keeps.
        ``body_cache_bytes``: benchmark mode. Keep up to this many bytes of built bodies
        and answer an identical request (same fields and seed) from them, so the engine
        spends no CPU building what it already sent (its ``request_id`` is then the first
        request's). 0 (default): every body is built afresh.

    Raises :class:`ValueError` naming the field and the bad value.
    """

    wire: Literal["msgpack", "json"] = "msgpack"
    model_path: str = "stand-in/tiny-diffusion"
    host: str = "127.0.0.1"
    port: int = 0
    latent_channels: int = 4
    latent_height: int = 8
    latent_width: int = 8
    num_frames: int = 1
    vae_scale_factor: int = 2
    patch_size: int = 2
    text_seq_len: int = 5
    text_hidden_size: int = 16
    num_inference_steps: int = 3
    num_outputs_per_prompt: int = 1
    guidance_scale: float = 4.0
    rollout_noise_level: float = 0.7
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    step_latency_s: float = 0.0
    max_concurrent: int = 4
    warmup_s: float = 0.0
    default_groups: frozenset[str] = OPTIONAL_GROUPS
    null_groups: bool = False
    max_response_bytes: int = 8 << 30
    request_log_limit: int = 10_000
    body_cache_bytes: int = 0

    def __post_init__(self) -> None:
        if self.wire not in _WIRES:
            raise ValueError(f"StandInConfig.wire must be one of {_WIRES}, got {self.wire!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"StandInConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for name in ("model_path", "host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"StandInConfig.{name} must be a non-empty string, got {value!r}")
        if not _is_int(self.port) or not 0 <= self.port <= 65535:
            raise ValueError(f"StandInConfig.port must be an int in [0, 65535], got {self.port!r}")
        for name in (
            "latent_channels",
            "latent_height",
            "latent_width",
            "num_frames",
            "vae_scale_factor",
            "patch_size",
            "text_seq_len",
            "text_hidden_size",
            "num_inference_steps",
            "num_outputs_per_prompt",
            "max_concurrent",
            "max_response_bytes",
            "request_log_limit",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"StandInConfig.{name} must be an int >= 1, got {value!r}")
        if not _is_int(self.body_cache_bytes) or self.body_cache_bytes < 0:
            raise ValueError(
                f"StandInConfig.body_cache_bytes must be an int >= 0, got {self.body_cache_bytes!r}"
            )
        for name in ("latent_height", "latent_width"):
            if getattr(self, name) % self.patch_size:
                raise ValueError(
                    f"StandInConfig.{name} must be a multiple of patch_size={self.patch_size}, "
                    f"got {getattr(self, name)!r}"
                )
        for name in ("guidance_scale", "rollout_noise_level", "step_latency_s", "warmup_s"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"StandInConfig.{name} must be a finite number >= 0, got {value!r}"
                )
        if not isinstance(self.null_groups, bool):
            raise ValueError(f"StandInConfig.null_groups must be a bool, got {self.null_groups!r}")
        if isinstance(self.default_groups, str) or not _is_iterable(self.default_groups):
            raise ValueError(
                f"StandInConfig.default_groups must be a set of group names, got {self.default_groups!r}"
            )
        groups = frozenset(self.default_groups)
        if not groups <= OPTIONAL_GROUPS:
            raise ValueError(
                f"StandInConfig.default_groups has unknown groups {sorted(groups - OPTIONAL_GROUPS)}; "
                f"known: {sorted(OPTIONAL_GROUPS)}"
            )
        object.__setattr__(self, "default_groups", groups)

    @property
    def content_type(self) -> str:
        """The Content-Type of ``/rollout/generate`` answers for this wire form."""
        return "application/msgpack" if self.wire == "msgpack" else "application/json"

    @property
    def sglang_version(self) -> str:
        """The SGLang version this wire form stands for, reported by ``/server_info``."""
        return "0.5.23" if self.wire == "msgpack" else "0.5.15"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_iterable(value: object) -> bool:
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True
