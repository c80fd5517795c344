"""The transport benchmark still runs (a smoke run: one mode, two prompts); never timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_transport_benchmark_prints_its_table_json_and_chart(tmp_path: Path) -> None:
    chart = tmp_path / "transport.png"
    command = [
        sys.executable,
        "benchmarks/transport.py",
        "--quick",
        "--modes",
        "json-inline,msgpack-fetch",
        "--prompts",
        "2",
        "--handoff-mb",
        "8",
        "--out",
        str(chart),
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    modes = {m["mode"]: m for m in summary["modes"]}
    assert set(modes) == {"json-inline", "msgpack-fetch"}
    assert all(m["failed_samples"] == 0 and m["gb_delivered"] > 0 for m in modes.values())
    assert modes["json-inline"]["speedup_vs_naive"] == 1.0
    assert "vs naive" in out.stdout and chart.stat().st_size > 10_000
