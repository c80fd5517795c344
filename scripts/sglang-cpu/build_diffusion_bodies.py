"""Build /rollout/generate bodies with SGLang's own diffusion response builder.

Run with the SGLang venv's python:

    python build_diffusion_bodies.py OUT_DIR

For each case, tensors from a seeded generator stand in for a pipeline's output (no model
needed) and go through ``_build_response`` -- the function the ``/rollout/generate`` route
of sglang 0.5.23 calls after generation -- then through the same
``msgspec.msgpack.encode(model_dump())`` the route answers with. Writes ``CASE.msgpack``
and ``manifest.json``: per case the request fields and, for every tensor, its path,
shape, dtype and the SHA-256 of its raw bytes, so a client can check what it decodes.

SGLang 0.5.23 has no base64/JSON response path any more (that was <= 0.5.15), so only
msgpack bodies are built.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import torch
from sglang.multimodal_gen.runtime.entrypoints.post_training.rollout_api import _build_response
from sglang.multimodal_gen.runtime.post_training.rl_dataclasses import (
    RolloutDebugTensors,
    RolloutDenoisingEnv,
    RolloutDitTrajectory,
    RolloutTrajectoryData,
)

#: name -> (dtype, batch, steps, latent shape, output shape, rollout)
CASES: dict[str, tuple[torch.dtype, int, int, tuple[int, ...], tuple[int, ...], bool]] = {
    "image_fp32": (torch.float32, 2, 3, (4, 8, 8), (3, 16, 16), True),
    "image_bf16": (torch.bfloat16, 2, 3, (4, 8, 8), (3, 16, 16), True),
    "image_fp16": (torch.float16, 2, 2, (4, 6, 10), (3, 12, 20), True),
    "video_bf16": (torch.bfloat16, 2, 2, (4, 3, 4, 4), (3, 5, 8, 8), True),
    "eval_fp32": (torch.float32, 2, 3, (4, 8, 8), (3, 16, 16), False),
}
TEXT_LEN, TEXT_DIM = 5, 8


def raw_sha(t: torch.Tensor) -> str:
    return hashlib.sha256(
        t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    ).hexdigest()


def build(name: str, seed: int) -> tuple[bytes, dict[str, Any]]:
    dtype, b, steps, latent, out_shape, rollout = CASES[name]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dt)

    output = rand(b, *out_shape)
    rtd = RolloutTrajectoryData(
        rollout_log_probs=rand(b, steps, dt=torch.float32),
        rollout_debug_tensors=RolloutDebugTensors(
            rollout_variance_noises=rand(b, steps, *latent),
            rollout_prev_sample_means=rand(b, steps, *latent),
            rollout_noise_std_devs=rand(b, steps, dt=torch.float32),
            rollout_model_outputs=rand(b, steps, *latent),
        ),
        denoising_env=RolloutDenoisingEnv(
            image_kwargs=None,
            pos_cond_kwargs={
                "encoder_hidden_states": rand(b, TEXT_LEN, TEXT_DIM),
                "txt_seq_lens": [TEXT_LEN] * b,
            },
            neg_cond_kwargs={
                "encoder_hidden_states": rand(b, TEXT_LEN, TEXT_DIM),
                "txt_seq_lens": [TEXT_LEN] * b,
            },
            guidance=rand(b, dt=torch.float32),
        ),
        dit_trajectory=RolloutDitTrajectory(
            latents=rand(b, steps + 1, *latent),
            timesteps=torch.linspace(1000, 0, steps, dtype=torch.float32),
            sigmas=torch.linspace(1, 0, steps + 1, dtype=torch.float32),
        ),
    )
    # The fields of OutputBatch that _build_response reads.
    result = SimpleNamespace(
        output=output,
        metrics=SimpleNamespace(total_duration_s=1.25),
        peak_memory_mb=321.5,
        rollout_trajectory_data=rtd,
    )
    prompt = f"a prompt for {name}"
    responses = _build_response(f"req-{name}", prompt, seed, rollout, result)
    payload = [r.model_dump() for r in responses]
    body = msgspec.msgpack.encode(payload)

    tensors: dict[str, Any] = {}

    def expect(path: str, t: torch.Tensor) -> None:
        tensors[path] = {"shape": list(t.shape), "dtype": str(t.dtype), "sha256": raw_sha(t)}

    for i in range(b):
        expect(f"{i}.generated_output", output[i])
        if not rollout:
            continue
        expect(f"{i}.rollout_log_probs", rtd.rollout_log_probs[i])
        dbg = rtd.rollout_debug_tensors
        for key in (
            "rollout_variance_noises",
            "rollout_prev_sample_means",
            "rollout_noise_std_devs",
            "rollout_model_outputs",
        ):
            expect(f"{i}.rollout_debug_tensors.{key}", getattr(dbg, key)[i])
        env = rtd.denoising_env
        for side in ("pos_cond_kwargs", "neg_cond_kwargs"):
            expect(
                f"{i}.denoising_env.{side}.encoder_hidden_states",
                getattr(env, side)["encoder_hidden_states"][i],
            )
        expect(f"{i}.denoising_env.guidance", env.guidance[i])
        expect(f"{i}.dit_trajectory.latents", rtd.dit_trajectory.latents[i])
        expect(f"{i}.dit_trajectory.timesteps", rtd.dit_trajectory.timesteps)
        expect(f"{i}.dit_trajectory.sigmas", rtd.dit_trajectory.sigmas)
    manifest = {
        "prompt": prompt,
        "seed": seed,
        "request_id": f"req-{name}",
        "batch": b,
        "steps": steps,
        "rollout": rollout,
        "inference_time_s": 1.25,
        "peak_memory_mb": 321.5,
        "txt_seq_lens": [TEXT_LEN] * b,
        "tensors": tensors,
    }
    return body, manifest


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for k, name in enumerate(CASES):
        body, manifest[name] = build(name, seed=1000 + k)
        (out / f"{name}.msgpack").write_bytes(body)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"build_diffusion_bodies: {len(CASES)} bodies in {out}")


if __name__ == "__main__":
    main()
