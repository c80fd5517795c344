"""A driver killed by SIGKILL or SIGTERM leaves no worker, fork server or tracker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 15.0


def _start_job() -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.pool_job"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert job.stdout is not None
    line = job.stdout.readline()
    assert line.strip() == b"ready", line
    children = psutil.Process(job.pid).children(recursive=True)
    assert len(children) >= 3  # workers, fork server, resource tracker
    return job, children


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_nothing_of_a_killed_job_is_left_and_its_stdout_closes(sig: signal.Signals) -> None:
    job, children = _start_job()
    os.kill(job.pid, sig)
    start = time.monotonic()
    assert job.stdout is not None
    job.wait(BOUND_S)
    # What `$(python job.py)` waits for: every holder of the pipe gone.
    job.stdout.read()
    job.stdout.close()
    _, alive = psutil.wait_procs(children, timeout=max(0.1, BOUND_S - (time.monotonic() - start)))
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert time.monotonic() - start < BOUND_S
