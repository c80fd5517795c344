"""SIGTERM closes a job run with run_sync cleanly: its pools stop, nothing is left."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

JOB = Path(__file__).with_name("sigterm_job.py")
ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_unwinds_the_job_and_leaves_no_process() -> None:
    job = subprocess.Popen(
        [sys.executable, str(JOB)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None
        assert job.stdout.readline().strip() == "ready"
        children = psutil.Process(job.pid).children(recursive=True)
        assert children  # the pool's worker (and the fork server)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, err[-2000:]
    assert out.split() == ["closing"]  # the cancellation unwound the job's code
    deadline = time.monotonic() + 15
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, [c.cmdline() for c in children if c.is_running()]
        time.sleep(0.1)
