"""The scale benchmark still runs (a smoke run, --quick); never timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_scale_benchmark_prints_its_table_and_json() -> None:
    command = [
        sys.executable,
        "benchmarks/scale.py",
        "--quick",
        "--requests",
        "64",
        "--reward-calls",
        "16",
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    modes = {m["mode"]: m for m in json.loads(line)["scale"]}
    assert set(modes) == {
        "direct@16",
        "smg@16",
        "latency-direct@16",
        "latency-smg@16",
        "reward-local",
        "reward-dask",
        "reward-local-sequential",
        "reward-dask-sequential",
    }
    # Counters, not timings: no rid was served twice, through smg or not.
    assert all(m.get("served_twice", 0) == 0 for m in modes.values())
    assert modes["smg@16"]["baseline"] == "direct@16"
    assert modes["reward-dask"]["baseline"] == "reward-local"
    assert "| smg@16 |" in out.stdout
