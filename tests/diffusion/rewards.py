"""Reward functions for pipeline tests (importable by workers)."""

from __future__ import annotations

import time

from miles_lite.types import Sample


def output_mean(samples: list[Sample]) -> list[float]:
    return [float(s.generated_output.float().mean()) for s in samples]  # type: ignore[union-attr]


def slow_output_mean(samples: list[Sample]) -> list[float]:
    time.sleep(0.3)
    return output_mean(samples)


def fails_on_dogs(samples: list[Sample]) -> list[float]:
    if any("dog" in str(s.prompt) for s in samples):
        raise ValueError("no dogs allowed")
    return output_mean(samples)


def group_size(samples: list[Sample]) -> list[dict[str, float]]:
    return [{"group_size": float(len(samples)), "seed": float(s.seed or 0)} for s in samples]


def minus_one(samples: list[Sample]) -> list[float]:
    return [-1.0 for _ in samples]
