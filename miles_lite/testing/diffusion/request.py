"""A ``/rollout/generate`` request body, checked as SGLang checks it, with model defaults.

Type errors are 422 (FastAPI/pydantic style: ``{"detail": [{"type", "loc", "msg",
"input"}]}``); bad values are 400 (``{"detail": "Invalid sampling params: ..."}``). Null
fields are dropped and the model default applies; unknown top-level keys are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miles_lite.testing.diffusion.config import StandInConfig

__all__ = ["SDE_TYPES", "InvalidRequestError", "RolloutRequest"]

#: Values ``rollout_sde_type`` accepts.
SDE_TYPES = ("sde", "cps", "ode")

_INT_FIELDS = (
    "seed",
    "width",
    "height",
    "num_inference_steps",
    "num_outputs_per_prompt",
    "num_frames",
    "fps",
)
_FLOAT_FIELDS = ("guidance_scale", "true_cfg_scale", "rollout_noise_level")
_BOOL_FIELDS = (
    "rollout",
    "rollout_log_prob_no_const",
    "rollout_debug_mode",
    "rollout_return_denoising_env",
    "rollout_return_dit_trajectory",
)
_STR_FIELDS = (
    "prompt",
    "negative_prompt",
    "generator_device",
    "rollout_sde_type",
    "rid",
    "request_id",
)
_INT_LIST_FIELDS = ("rollout_sde_step_indices", "rollout_return_step_indices")
_DICT_FIELDS = ("extra_sampling_params",)


class InvalidRequestError(ValueError):
    """Raised when a ``/rollout/generate`` body is refused; ``status`` is 400 or 422.

    ``detail`` is what goes in the ``{"detail": ...}`` answer: a string for 400, a list of
    pydantic-style error maps for 422.
    """

    def __init__(self, status: int, detail: str | list[dict[str, Any]]) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutRequest:
    """A checked request with every model default filled in.

    Sizes: ``width``/``height`` in pixels; ``latent_shape`` is one state of the latent,
    ``(C, H, W)`` for one frame or ``(C, F, H, W)`` for more. ``sde_step_indices`` are the
    steps that carry log-probs and debug tensors (all ``T`` steps unless the request
    names some). ``seed`` is None when the request has none (the server then fails with a
    500 after generating, as SGLang does).
    """

    rid: str | None
    prompt: str
    negative_prompt: str | None
    seed: int | None
    width: int
    height: int
    num_frames: int
    num_inference_steps: int
    num_outputs_per_prompt: int
    guidance_scale: float
    rollout: bool
    sde_type: str
    noise_level: float
    sde_step_indices: tuple[int, ...]
    return_debug_tensors: bool
    return_denoising_env: bool
    return_dit_trajectory: bool
    latent_shape: tuple[int, ...]

    @classmethod
    def parse(cls, body: object, config: StandInConfig) -> RolloutRequest:
        """Check ``body`` (the decoded JSON) and fill in defaults from ``config``.

        Raises :class:`InvalidRequestError` (422 for a wrong type or a body that is not an
        object, 400 for a bad value).
        """
        if not isinstance(body, dict):
            raise InvalidRequestError(
                422,
                [
                    _error(
                        "model_attributes_type",
                        ("body",),
                        "Input should be a valid dictionary or object to extract fields from",
                        body,
                    )
                ],
            )
        fields = {k: v for k, v in body.items() if v is not None}
        _check_types(fields)
        return _resolve(fields, config)

    def tensor_bytes(self, config: StandInConfig) -> int:
        """How many tensor bytes (not counting encoding) the answer to this request holds."""
        big = 4 if config.dtype == "float32" else 2
        latent = math.prod(self.latent_shape)
        t, s = self.num_inference_steps, len(self.sde_step_indices)
        per_sample = 3 * self.num_frames * self.height * self.width * big
        if self.rollout:
            per_sample += 4 * s
            if self.return_debug_tensors:
                per_sample += 3 * s * latent * big + 4 * s
            if self.return_denoising_env:
                conds = 1 if self.negative_prompt is None else 2
                per_sample += conds * config.text_seq_len * config.text_hidden_size * big + 4
            if self.return_dit_trajectory:
                per_sample += (t + 1) * latent * big + 4 * t
                if config.wire == "msgpack":
                    per_sample += 4 * (t + 1)
        return per_sample * self.num_outputs_per_prompt


def _error(kind: str, loc: tuple[str, ...], msg: str, value: object) -> dict[str, Any]:
    return {"type": kind, "loc": list(loc), "msg": msg, "input": value}


def _check_types(fields: dict[str, Any]) -> None:
    errors: list[dict[str, Any]] = []
    if "prompt" not in fields:
        errors.append(_error("missing", ("body", "prompt"), "Field required", None))
    for name, value in fields.items():
        loc = ("body", name)
        if name in _INT_FIELDS and (not isinstance(value, int) or isinstance(value, bool)):
            errors.append(_error("int_type", loc, "Input should be a valid integer", value))
        elif name in _FLOAT_FIELDS and (
            not isinstance(value, (int, float)) or isinstance(value, bool)
        ):
            errors.append(_error("float_type", loc, "Input should be a valid number", value))
        elif name in _BOOL_FIELDS and not isinstance(value, bool):
            errors.append(_error("bool_type", loc, "Input should be a valid boolean", value))
        elif name in _STR_FIELDS and not isinstance(value, str):
            errors.append(_error("string_type", loc, "Input should be a valid string", value))
        elif name in _DICT_FIELDS and not isinstance(value, dict):
            errors.append(_error("dict_type", loc, "Input should be a valid dictionary", value))
        elif name in _INT_LIST_FIELDS:
            if not isinstance(value, list):
                errors.append(_error("list_type", loc, "Input should be a valid list", value))
            else:
                errors.extend(
                    _error("int_type", (*loc, str(i)), "Input should be a valid integer", item)
                    for i, item in enumerate(value)
                    if not isinstance(item, int) or isinstance(item, bool)
                )
    if errors:
        raise InvalidRequestError(422, errors)


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(400, f"Invalid sampling params: {message}")


def _resolve(fields: dict[str, Any], config: StandInConfig) -> RolloutRequest:
    multiple = config.vae_scale_factor * config.patch_size
    width = fields.get("width", config.latent_width * config.vae_scale_factor)
    height = fields.get("height", config.latent_height * config.vae_scale_factor)
    for name, value in (("width", width), ("height", height)):
        if value < 1 or value % multiple:
            raise _invalid(f"{name} must be a positive multiple of {multiple}, got {value}")
    positive = {
        "num_inference_steps": fields.get("num_inference_steps", config.num_inference_steps),
        "num_outputs_per_prompt": fields.get(
            "num_outputs_per_prompt", config.num_outputs_per_prompt
        ),
        "num_frames": fields.get("num_frames", config.num_frames),
        "fps": fields.get("fps", 1),
    }
    for name, value in positive.items():
        if value < 1:
            raise _invalid(f"{name} must be >= 1, got {value}")
    steps = positive["num_inference_steps"]
    frames = positive["num_frames"]
    guidance = float(fields.get("guidance_scale", config.guidance_scale))
    noise = float(fields.get("rollout_noise_level", config.rollout_noise_level))
    for name, number in (
        ("guidance_scale", guidance),
        ("true_cfg_scale", float(fields.get("true_cfg_scale", 1.0))),
        ("rollout_noise_level", noise),
    ):
        if not math.isfinite(number) or number < 0:
            raise _invalid(f"{name} must be a finite number >= 0, got {number}")
    sde_type = fields.get("rollout_sde_type", "sde")
    if sde_type not in SDE_TYPES:
        raise _invalid(f"rollout_sde_type must be one of {list(SDE_TYPES)}, got {sde_type!r}")
    indices = _step_indices(fields, "rollout_sde_step_indices", steps)
    _step_indices(fields, "rollout_return_step_indices", steps)
    lh, lw = height // config.vae_scale_factor, width // config.vae_scale_factor
    c = config.latent_channels
    latent_shape = (c, lh, lw) if frames == 1 else (c, frames, lh, lw)
    request = RolloutRequest(
        rid=fields.get("rid", fields.get("request_id")),
        prompt=fields["prompt"],
        negative_prompt=fields.get("negative_prompt"),
        seed=fields.get("seed"),
        width=width,
        height=height,
        num_frames=frames,
        num_inference_steps=steps,
        num_outputs_per_prompt=positive["num_outputs_per_prompt"],
        guidance_scale=guidance,
        rollout=fields.get("rollout", True),
        sde_type=sde_type,
        noise_level=noise,
        sde_step_indices=indices,
        return_debug_tensors=_group(fields, "rollout_debug_mode", "rollout_debug_tensors", config),
        return_denoising_env=_group(
            fields, "rollout_return_denoising_env", "denoising_env", config
        ),
        return_dit_trajectory=_group(
            fields, "rollout_return_dit_trajectory", "dit_trajectory", config
        ),
        latent_shape=latent_shape,
    )
    nbytes = request.tensor_bytes(config)
    if nbytes > config.max_response_bytes:
        raise _invalid(
            f"the answer would hold {nbytes} tensor bytes, over the stand-in's "
            f"max_response_bytes={config.max_response_bytes}"
        )
    return request


def _group(fields: dict[str, Any], flag: str, group: str, config: StandInConfig) -> bool:
    if config.null_groups:
        return False
    value = fields.get(flag)
    return group in config.default_groups if value is None else bool(value)


def _step_indices(fields: dict[str, Any], name: str, steps: int) -> tuple[int, ...]:
    value = fields.get(name)
    if value is None:
        return tuple(range(steps))
    if not value or len(set(value)) != len(value) or any(not 0 <= i < steps for i in value):
        raise _invalid(f"{name} must be distinct step indices in [0, {steps}), got {value}")
    return tuple(value)
