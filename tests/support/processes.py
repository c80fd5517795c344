"""Whether a process still runs, for tests that check nothing outlived what they stopped."""

from __future__ import annotations

import time

import psutil

__all__ = ["alive", "wait_gone"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and not yet reaped by whoever adopted
    it, does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Until process ``pid`` (a child of this one or not) no longer runs; fails the test
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout_s} s"
        time.sleep(0.01)
