"""Bodies for pool tests, built with the real encoder."""

from __future__ import annotations

from typing import Any

import torch

from miles_lite.testing import encode_json_body, encode_msgpack_body


def items(seed: int, n: int = 2, size: int = 256) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed + i)
        out.append(
            {
                "request_id": f"rid-{seed}",
                "seed": seed,
                "generated_output": torch.randn(3, 8, 8, generator=g),
                "rollout_log_probs": torch.randn(3, generator=g),
                "dit_trajectory": {
                    "latents": torch.randn(4, size, generator=g).to(torch.bfloat16),
                    "timesteps": torch.arange(3, dtype=torch.float32),
                    "sigmas": None,
                },
            }
        )
    return out


def body(seed: int, *, form: str = "msgpack", n: int = 2, size: int = 256) -> bytes:
    encode = encode_msgpack_body if form == "msgpack" else encode_json_body
    return encode(items(seed, n, size))


CTYPE = {"msgpack": "application/msgpack", "json": "application/json"}
