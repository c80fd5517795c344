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
