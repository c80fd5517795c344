"""The training benchmark still runs (a smoke run on a small load); its counters, never its
timings, are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_training_benchmark_prints_its_table_and_json() -> None:
    command = [
        sys.executable,
        "benchmarks/training.py",
        "--repeats",
        "1",
        "--in-flight",
        "0",
        "8",
        "--tokens",
        "30",
        "--groups",
        "2",
        "--steps",
        "2",
        "--train-s",
        "0.05",
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    rows = {r["mode"]: r for r in json.loads(line)["training"]}
    assert set(rows) == {
        *(f"update@{m}/{n}" for m in ("retract", "in_place", "abort") for n in (0, 8)),
        "loop/run",
        "loop/stream",
    }
    # Requests in flight survive a retract or in_place update, their samples spanning the
    # two versions; an abort pause ends them.
    for mode in ("retract", "in_place"):
        assert rows[f"update@{mode}/8"]["survived"] == 8
        assert rows[f"update@{mode}/8"]["two_versions"] == 8
    assert rows["update@abort/8"]["survived"] == 0
    assert rows["update@retract/0"]["ratio"] == 1.0
    assert "loop ratio: run / stream" in out.stdout
