from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.testing import (
    InvalidRequestError,
    RolloutRequest,
    StandInConfig,
    encode_json_body,
    encode_msgpack_body,
    sigma_schedule,
    synthetic_body,
    synthetic_sample,
)

REQUEST: dict[str, Any] = {
    "prompt": "a cat",
    "seed": 42,
    "rid": "req-abc",
    "num_outputs_per_prompt": 2,
}
ROLLOUT_KEYS = [
    "request_id",
    "prompt",
    "seed",
    "generated_output",
    "rollout_log_probs",
    "rollout_debug_tensors",
    "denoising_env",
    "dit_trajectory",
    "inference_time_s",
    "peak_memory_mb",
]


def sample(i: int = 0, config: StandInConfig | None = None, **request: Any) -> dict[str, Any]:
    body = {**REQUEST, **request}
    return synthetic_sample(
        seed=body["seed"], sample_index_in_request=i, request=body, config=config or StandInConfig()
    )


def tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    return 0


def test_sample_is_deterministic_and_marks_its_seed() -> None:
    first, again, second = sample(0), sample(0), sample(1)
    assert list(first) == ROLLOUT_KEYS
    latents = first["dit_trajectory"]["latents"]
    assert torch.equal(latents, again["dit_trajectory"]["latents"])
    assert latents.flatten()[0].item() == 42.0
    assert second["dit_trajectory"]["latents"].flatten()[0].item() == 43.0
    assert not torch.equal(first["generated_output"], second["generated_output"])
    assert first["seed"] == second["seed"] == 42
    assert first["request_id"] == "req-abc"
    # Successive steps are not copies of each other.
    assert not torch.equal(latents[1], latents[2])


def test_default_shapes_match_the_capture(captures: Path) -> None:
    real = decode_to_tensors(
        bytearray((captures / "rollout_generate_sample.msgpack").read_bytes()),
        "application/msgpack",
    )[0]
    ours = sample(0, num_inference_steps=3)
    for group, key in [
        (None, "generated_output"),
        (None, "rollout_log_probs"),
        ("dit_trajectory", "latents"),
        ("dit_trajectory", "timesteps"),
        ("dit_trajectory", "sigmas"),
        ("rollout_debug_tensors", "rollout_model_outputs"),
        ("denoising_env", "guidance"),
    ]:
        a = real[key] if group is None else real[group][key]
        b = ours[key] if group is None else ours[group][key]
        assert a.shape == b.shape and a.dtype == b.dtype, key
    # The schedule reproduces the capture's values exactly.
    assert torch.equal(ours["dit_trajectory"]["timesteps"], real["dit_trajectory"]["timesteps"])
    assert torch.equal(ours["dit_trajectory"]["sigmas"], real["dit_trajectory"]["sigmas"])
    assert torch.equal(ours["denoising_env"]["guidance"], real["denoising_env"]["guidance"])
    assert ours["denoising_env"]["image_kwargs"] == real["denoising_env"]["image_kwargs"]
    assert ours["denoising_env"]["pos_cond_kwargs"]["txt_seq_lens"] == [5, 5]
    assert torch.equal(sigma_schedule(3), torch.tensor([1.0, 0.75, 0.5, 0.0]))


def test_video_latents_are_5d_and_bf16_keeps_scalars_float32() -> None:
    config = StandInConfig(dtype="bfloat16")
    video = sample(0, config, num_frames=3, width=32, height=16, num_inference_steps=4)
    assert video["dit_trajectory"]["latents"].shape == (5, 4, 3, 8, 16)
    assert video["dit_trajectory"]["latents"].dtype == torch.bfloat16
    assert video["generated_output"].shape == (3, 3, 16, 32)
    assert video["rollout_debug_tensors"]["rollout_variance_noises"].shape == (4, 4, 3, 8, 16)
    assert video["denoising_env"]["image_kwargs"]["img_shapes"] == [[[3, 4, 8]]]
    for scalar in (video["rollout_log_probs"], video["dit_trajectory"]["timesteps"]):
        assert scalar.dtype == torch.float32
    image = sample(0, config)
    assert image["dit_trajectory"]["latents"].shape == (4, 4, 8, 8)


def test_eval_request_returns_only_the_output() -> None:
    assert list(sample(0, rollout=False)) == ["request_id", "prompt", "seed", "generated_output"]


def test_groups_follow_request_flags_then_config() -> None:
    off = sample(0, rollout_return_dit_trajectory=False, rollout_debug_mode=False)
    assert off["dit_trajectory"] is None and off["rollout_debug_tensors"] is None
    assert off["denoising_env"] is not None
    none_by_default = StandInConfig(default_groups=frozenset())
    quiet = sample(0, none_by_default, rollout_return_denoising_env=True)
    assert quiet["dit_trajectory"] is None and quiet["denoising_env"] is not None
    forced = sample(0, StandInConfig(null_groups=True), rollout_return_dit_trajectory=True)
    assert [forced[k] for k in ("rollout_debug_tensors", "denoising_env", "dit_trajectory")] == [
        None
    ] * 3
    assert list(forced) == ROLLOUT_KEYS


def test_sde_step_indices_select_the_logged_steps() -> None:
    picked = sample(0, num_inference_steps=5, rollout_sde_step_indices=[0, 3])
    assert picked["rollout_log_probs"].shape == (2,)
    assert picked["rollout_debug_tensors"]["rollout_model_outputs"].shape == (2, 4, 8, 8)
    assert picked["dit_trajectory"]["latents"].shape == (6, 4, 8, 8)
    ode = sample(0, rollout_sde_type="ode")
    assert not ode["rollout_debug_tensors"]["rollout_noise_std_devs"].any()


def test_json_form_has_no_sigmas_and_the_same_tensors() -> None:
    msgpack_sample = sample(1)
    json_sample = sample(1, StandInConfig(wire="json"))
    assert "sigmas" not in json_sample["dit_trajectory"]
    assert torch.equal(
        json_sample["dit_trajectory"]["latents"], msgpack_sample["dit_trajectory"]["latents"]
    )


@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_body_is_the_encoding_of_the_samples(wire: str) -> None:
    config = StandInConfig(wire=wire)  # type: ignore[arg-type]
    items = [sample(i, config, num_outputs_per_prompt=3) for i in range(3)]
    encode = encode_msgpack_body if wire == "msgpack" else encode_json_body
    assert synthetic_body({**REQUEST, "num_outputs_per_prompt": 3}, config) == encode(items)


@pytest.mark.parametrize(
    "request_fields",
    [
        {},
        {"rollout": False},
        {"negative_prompt": "blur", "num_frames": 2},
        {"rollout_debug_mode": False},
    ],
)
@pytest.mark.parametrize("wire", ["msgpack", "json"])
def test_size_estimate_matches_the_tensors(request_fields: dict[str, Any], wire: str) -> None:
    config = StandInConfig(wire=wire, dtype="float16")  # type: ignore[arg-type]
    body = {**REQUEST, **request_fields}
    items = [sample(i, config, **request_fields) for i in range(2)]
    assert RolloutRequest.parse(body, config).tensor_bytes(config) == sum(map(tensor_bytes, items))


def test_request_over_the_size_limit_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        sample(0, StandInConfig(max_response_bytes=1000))
    assert info.value.status == 400
    assert "max_response_bytes" in str(info.value.detail)
