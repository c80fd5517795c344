"""Module-level functions for pool tests (importable by workers)."""

from __future__ import annotations

import os
import time


def pid() -> int:
    return os.getpid()


def slow(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def boom(message: str) -> None:
    raise KeyError(message)


def die() -> None:
    os._exit(3)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def niceness() -> int:
    return os.nice(0)


def die_on_start_if(marker: str) -> None:
    """A worker initializer that dies while starting when ``marker`` exists."""
    if os.path.exists(marker):
        os._exit(4)


def hang_reward(samples: list) -> list:  # type: ignore[type-arg]
    time.sleep(3600)
    return [0.0] * len(samples)


def nan_reward(samples: list) -> list:  # type: ignore[type-arg]
    return [float("nan") if s.index == 1 else 1.0 for s in samples]


def failing_reward(samples: list) -> list:  # type: ignore[type-arg]
    raise ValueError("no answer to grade")


def text_reward(samples: list) -> list:  # type: ignore[type-arg]
    return [{"score": float(s.response == s.label), "len": len(s.response)} for s in samples]


def heavy_modules() -> list[str]:
    """The heavy libraries this process has imported (torch, aiohttp, numpy)."""
    import sys

    return sorted({"torch", "aiohttp", "numpy"} & set(sys.modules))
