"""Reward functions for the Dask pool tests, importable by cluster workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from miles_lite.types import Sample


def response_score(samples: list[Sample]) -> list[dict[str, float]]:
    """A deterministic score of the text, and the process that computed it."""
    return [
        {"score": len(s.response) + sum(s.tokens) % 97 / 100, "pid": float(os.getpid())}
        for s in samples
    ]


def output_mean(samples: list[Sample]) -> list[float]:
    """The mean of a diffusion output (a tensor, or an arena place resolved by the pool)."""
    return [float(s.generated_output.float().mean()) for s in samples]  # type: ignore[union-attr]


def slow_unless_victim(samples: list[Sample]) -> list[float]:
    """0.1 s per call; a sample whose label is a path writes its pid there and hangs (the
    test kills its worker)."""
    for sample in samples:
        if isinstance(sample.label, str) and sample.label.endswith(".pid"):
            Path(sample.label).write_text(str(os.getpid()))
            time.sleep(120)
    time.sleep(0.1)
    return [1.0 for _ in samples]


def raises(samples: list[Sample]) -> list[float]:
    raise ValueError(f"cannot score {len(samples)} samples")


def sleeps(samples: list[Sample]) -> list[float]:
    time.sleep(3)
    return [0.0 for _ in samples]


class Loaded:
    """A model-backed reward: ``load()`` runs once per worker process."""

    def __init__(self) -> None:
        self.loads = 0

    def load(self) -> None:
        self.loads += 1

    def __call__(self, samples: list[Sample]) -> list[dict[str, float]]:
        return [{"loads": float(self.loads), "pid": float(os.getpid())} for _ in samples]
