"""The text benchmark's miles rows run: miles' own session server (its process) and its
client-side sample assembly (another), on the same chat load as miles_lite's rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_miles_session_server_rows_come_out_of_the_benchmark(tmp_path: Path) -> None:
    venv = Path(
        os.environ.get("MILES_LITE_MILES_VENV", Path.home() / ".cache/miles-lite/miles-peer-venv")
    )
    if not (venv / ".stamps" / "check").exists():
        pytest.fail(f"no miles venv at {venv}: run benchmarks/miles_peer/setup.sh {venv}")
    command = [
        sys.executable,
        "benchmarks/text_layer.py",
        *("--requests", "32", "--concurrency", "4", "--latency-concurrency", "4"),
        *("--chat-sessions", "2", "--chat-turns", "3", "--turn-sweep", "4"),
        *("--stop-inflight", "8", "--png", str(tmp_path / "chart.png")),
        *("--miles-peer", "--miles-venv", str(venv)),
    ]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    modes = {m["mode"]: m for m in json.loads(line)["text_layer"]}
    for peer in ("miles@2", "miles-aiohttp@2"):
        # The benchmark itself fails when miles lost a turn or a session's sample.
        assert modes[peer]["requests_per_s"] > 0 and modes[peer]["bad_masks"] == 0
        assert modes[peer]["assembly_ms_per_turn"] > 0
    assert modes["chat@2"]["throughput_vs_miles"] > 0
    assert modes["chat-aiohttp@2"]["throughput_vs_miles"] > 0
