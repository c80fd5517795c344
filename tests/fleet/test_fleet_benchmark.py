"""The fleet benchmark still runs (a smoke run: a tiny preset, one repeat); its counters,
never its timings, are checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Two stand-in children and at least one restart: a minute on a loaded 2-core machine.
@pytest.mark.timeout(300)
def test_the_fleet_benchmark_prints_its_table_and_json() -> None:
    command = [
        sys.executable,
        "benchmarks/fleet.py",
        "--prompts",
        "8",
        "--samples-per-prompt",
        "2",
        "--tokens",
        "32",
        "--kill-every-s",
        "0.5",
        "--repeats",
        "1",
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    fleet = json.loads(line)["fleet"]
    steady, killed = fleet["steady"], fleet["killed"]
    # Every sample given came back exactly once, in both modes.
    assert steady["samples"] == killed["samples"] == 16
    assert steady["exactly_once"] and killed["exactly_once"]
    assert (steady["failed"], steady["kills"], steady["fenced"]) == (0, 0, 0)
    # Each kill brings the engine back on its launch weights: fenced, caught up, and no
    # request reached it before it reported the current version.
    assert killed["kills"] >= 1 and killed["fenced"] >= 1 and killed["catch_ups"] >= 1
    assert fleet["early_requests"] == 0 and fleet["catch_up_gave_up"] == 0
    assert "killed/steady samples/s" in out.stdout
