"""The journal benchmark still runs (a smoke run: a tiny preset, one repeat); its counters,
never its timings, are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# The mock engine and the stand-in in processes of their own: a minute on a loaded box.
@pytest.mark.timeout(300)
def test_the_journal_benchmark_runs_the_grpo_loop_both_ways() -> None:
    sizes = {
        "--requests": 64,
        "--concurrency": 16,
        "--output-tokens": 32,
        "--prompt-tokens": 16,
        "--repeats": 1,
        "--recover-groups": 40,
        "--loop-steps": 2,
        "--loop-groups": 3,
        "--loop-tokens": 16,
        "--train-s": 0.05,
    }
    command = [sys.executable, "benchmarks/journal.py"]
    for flag, value in sizes.items():
        command += [flag, str(value)]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    journal = json.loads(line)["journal"]
    assert journal["recover"]["groups"] == 40
    assert journal["blocked_puts"] == 0
    grpo = journal["grpo"]
    # 2 steps of 3 groups of 4 samples trained, with and without the journal.
    assert grpo["none_samples"] == grpo["journal_samples"] == 2 * 3 * 4
    assert grpo["journal_writer_cpu_us"] > 0
    assert grpo["throughput_ratio"] > 0
    assert "streamed GRPO loop (2 steps x 3 groups x 4 samples x 16 tokens" in out.stdout
