"""SGLang-diffusion's ``/rollout/generate``: the request of a microgroup, and a decoded
answer item into its sample. Pure, no I/O (decoding the body is :mod:`miles_lite.codecs`)."""

from __future__ import annotations

from typing import Any

from miles_lite.errors import CodecError, ConfigError
from miles_lite.types import DiTTrajectory, Sample, SampleStatus

__all__ = ["ROLLOUT_PATH", "apply_response_item", "build_request"]

ROLLOUT_PATH = "/rollout/generate"


def build_request(samples: list[Sample], sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The ``/rollout/generate`` body of a microgroup: its first sample's seed, its size.

    Raises ``ConfigError`` when the first sample has no seed: a null seed makes SGLang
    fail with a 500 after generating.
    """
    first = samples[0]
    if first.seed is None:
        raise ConfigError(f"sample {first.index} has no seed; a diffusion request needs one")
    return {
        **sampling_params,
        "prompt": first.prompt,
        "seed": first.seed,
        "num_outputs_per_prompt": len(samples),
    }


def apply_response_item(sample: Sample, item: Any, *, seed: int) -> None:
    """Fill ``sample`` from one decoded per-sample map of a ``/rollout/generate`` answer.

    ``seed`` is the sample's own seed (request seed + its position): the engine echoes the
    request's seed unchanged for every sample. Raises CodecError on a non-map item.
    """
    if not isinstance(item, dict):
        raise CodecError(f"sample map expected, got {type(item).__name__}")
    sample.seed = seed
    sample.request_id = item.get("request_id")
    sample.generated_output = item.get("generated_output")
    sample.rollout_log_probs = item.get("rollout_log_probs")
    sample.rollout_debug_tensors = item.get("rollout_debug_tensors")
    sample.denoising_env = item.get("denoising_env")
    trajectory = item.get("dit_trajectory")
    sample.dit_trajectory = (
        DiTTrajectory(
            latents=trajectory.get("latents"),
            timesteps=trajectory.get("timesteps"),
            sigmas=trajectory.get("sigmas"),
        )
        if isinstance(trajectory, dict)
        else None
    )
    sample.inference_time_s = item.get("inference_time_s")
    sample.peak_memory_mb = item.get("peak_memory_mb")
    sample.status = SampleStatus.COMPLETED
