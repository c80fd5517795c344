"""Deterministic diffusion samples shaped exactly like SGLang's ``/rollout/generate`` maps.

Sample ``i`` of a request with seed ``s`` is a pure function of ``s + i``, the request and
the config, so a test can recompute what any sample must hold by calling
:func:`synthetic_sample`. The per-sample seed is visible in the data:
``dit_trajectory["latents"].flatten()[0] == float(s + i)`` (exact in float32 while
``|s + i| < 2**24``; rounded to the dtype for 16-bit dtypes).

Tensors are built at memory speed, whatever their size: a seeded block of
:data:`BLOCK_ELEMENTS` normal values (torch.Generator) is tiled over each tensor, with a
different rotation of the block per tensor. The block length is prime, so successive
steps, frames and rows do not repeat in lockstep.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.request import RolloutRequest

__all__ = ["BLOCK_ELEMENTS", "build_sample", "sigma_schedule", "synthetic_sample"]

#: Length of the seeded random block tiled over every tensor (a prime).
BLOCK_ELEMENTS = 4093

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def synthetic_sample(
    *, seed: int, sample_index_in_request: int, request: dict[str, Any], config: StandInConfig
) -> dict[str, Any]:
    """Sample ``sample_index_in_request`` of ``request``, as the stand-in engine sends it.

    ``seed`` is the request's seed (echoed unchanged in the ``seed`` key); the data derive
    from ``seed + sample_index_in_request``. ``request`` is a ``/rollout/generate`` JSON
    body (its ``seed`` is ignored in favour of the argument; ``rid`` or ``request_id``
    becomes ``request_id``, ``""`` if absent). Keys, their order and the nesting are those
    of ``captures/rollout_generate_sample.msgpack``:

    - rollout request: ``request_id, prompt, seed, generated_output [3, F, H, W],
      rollout_log_probs [S], rollout_debug_tensors, denoising_env, dit_trajectory,
      inference_time_s, peak_memory_mb``; a group turned off is None;
      ``dit_trajectory`` has no ``sigmas`` when ``config.wire == "json"``;
      ``inference_time_s`` is the modelled time (steps x ``step_latency_s``) and
      ``peak_memory_mb`` the sample's tensor MiB.
    - eval request (``rollout: false``): only ``request_id, prompt, seed, generated_output``.

    Raises :class:`~miles_lite.testing.InvalidRequestError` for a request the engine
    would refuse.
    """
    parsed = RolloutRequest.parse(request, config)
    parsed = dataclasses.replace(parsed, seed=seed, rid=parsed.rid or "")
    return build_sample(parsed, index=sample_index_in_request, config=config)


def sigma_schedule(num_inference_steps: int) -> torch.Tensor:
    """The ``[T+1]`` float32 sigmas: ``1 - k/(T+1)`` for ``k < T``, then 0.

    For ``T = 3`` this is ``[1, 0.75, 0.5, 0]``, as in the capture; timesteps are
    ``1000 * sigmas[:T]``.
    """
    t = num_inference_steps
    sigmas = 1.0 - torch.arange(t + 1, dtype=torch.float32) / (t + 1)
    sigmas[t] = 0.0
    return sigmas


def build_sample(request: RolloutRequest, *, index: int, config: StandInConfig) -> dict[str, Any]:
    """Sample ``index`` of an already checked request (its ``seed`` must be an int).

    The engine calls this once per output; :func:`synthetic_sample` is the same from a
    JSON body. Raises ValueError when ``request.seed`` is None.
    """
    if request.seed is None:
        raise ValueError("build_sample needs a request with an integer seed")
    sample_seed = request.seed + index
    generator = torch.Generator().manual_seed(sample_seed % (1 << 64))
    block = torch.randn(BLOCK_ELEMENTS, generator=generator)
    dtype = _TORCH_DTYPES[config.dtype]
    image_shape = (3, request.num_frames, request.height, request.width)
    sample: dict[str, Any] = {
        "request_id": request.rid if request.rid is not None else "",
        "prompt": request.prompt,
        "seed": request.seed,
        "generated_output": _tiled(torch.sigmoid(block), image_shape, dtype),
    }
    if not request.rollout:
        return sample

    steps = request.num_inference_steps
    latent = request.latent_shape
    n_sde = len(request.sde_step_indices)
    sigmas = sigma_schedule(steps)
    sample["rollout_log_probs"] = _tiled(-block.abs() - 1.0, (n_sde,), torch.float32)
    sample["rollout_debug_tensors"] = None
    if request.return_debug_tensors:
        noise = 0.0 if request.sde_type == "ode" else request.noise_level
        sde_sigmas = sigmas[list(request.sde_step_indices)]
        sample["rollout_debug_tensors"] = {
            "rollout_variance_noises": _tiled(block.roll(1), (n_sde, *latent), dtype),
            "rollout_prev_sample_means": _tiled(block.roll(2) * 0.5, (n_sde, *latent), dtype),
            "rollout_noise_std_devs": (sde_sigmas * noise).contiguous(),
            "rollout_model_outputs": _tiled(block.roll(3), (n_sde, *latent), dtype),
        }
    sample["denoising_env"] = None
    if request.return_denoising_env:
        sample["denoising_env"] = _denoising_env(request, block, config, dtype)
    sample["dit_trajectory"] = None
    if request.return_dit_trajectory:
        latents = _tiled(block, (steps + 1, *latent), dtype)
        latents.view(-1)[0] = float(sample_seed)
        sample["dit_trajectory"] = {
            "latents": latents,
            "timesteps": sigmas[:steps] * 1000.0,
            "sigmas": sigmas,
        }
    sample["inference_time_s"] = steps * config.step_latency_s
    # Counted before the JSON form drops sigmas: the engine's memory does not depend on it.
    sample["peak_memory_mb"] = round(_tensor_bytes(sample) / (1 << 20), 6)
    if config.wire == "json" and sample["dit_trajectory"] is not None:
        del sample["dit_trajectory"]["sigmas"]
    return sample


def _denoising_env(
    request: RolloutRequest, block: torch.Tensor, config: StandInConfig, dtype: torch.dtype
) -> dict[str, Any]:
    seq, hidden = config.text_seq_len, config.text_hidden_size
    lh, lw = request.latent_shape[-2:]
    p = config.patch_size
    lens = [seq] * request.num_outputs_per_prompt
    neg = None
    if request.negative_prompt is not None:
        neg = {
            "encoder_hidden_states": _tiled(block.roll(5), (seq, hidden), dtype),
            "txt_seq_lens": list(lens),
        }
    return {
        "image_kwargs": {"img_shapes": [[[request.num_frames, lh // p, lw // p]]]},
        "pos_cond_kwargs": {
            "encoder_hidden_states": _tiled(block.roll(4), (seq, hidden), dtype),
            "txt_seq_lens": lens,
        },
        "neg_cond_kwargs": neg,
        "guidance": torch.tensor([request.guidance_scale], dtype=torch.float32),
    }


def _tiled(block: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` filled with ``block`` repeated (memory speed)."""
    source = block.to(dtype)
    n = 1
    for d in shape:
        n *= d
    out = torch.empty(n, dtype=dtype)
    width = source.numel()
    rows, rest = divmod(n, width)
    if rows:
        out[: rows * width].view(rows, width).copy_(source.expand(rows, width))
    if rest:
        out[rows * width :].copy_(source[:rest])
    return out.view(shape)


def _tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list):
        return sum(_tensor_bytes(v) for v in tree)
    return 0
