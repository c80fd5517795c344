"""The JSON documents of a stand-in engine's info endpoints, shaped like SGLang's."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from miles_lite.testing.diffusion.config import StandInConfig

__all__ = ["model_info", "model_list", "server_info"]


def model_info(config: StandInConfig) -> dict[str, Any]:
    """The answer of ``GET /model_info``."""
    return {
        "model_path": config.model_path,
        "tokenizer_path": None,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "diffusion",
        "architectures": None,
    }


def server_info(config: StandInConfig, *, port: int) -> dict[str, Any]:
    """The answer of ``GET /server_info``: every config field (the bound ``port``), the
    SGLang ``version`` its wire form stands for, and ``"stand_in": true``."""
    args = asdict(config)
    args["default_groups"] = sorted(config.default_groups)
    args["port"] = port
    return {
        **args,
        "max_running_requests": config.max_concurrent,
        "version": config.sglang_version,
        "stand_in": True,
    }


def model_list(config: StandInConfig, *, created: int) -> dict[str, Any]:
    """The answer of ``GET /v1/models`` (``created`` in Unix seconds)."""
    return {
        "object": "list",
        "data": [
            {
                "id": config.model_path,
                "object": "model",
                "created": created,
                "owned_by": "sglang",
                "root": config.model_path,
                "parent": None,
                "max_model_len": None,
            }
        ],
    }
