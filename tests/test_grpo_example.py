"""The GRPO example runs its loop as a user would, here on a stand-in serving the tiny
model (the conformance tier runs it against the real SGLang server for 25 steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_grpo_example_trains_streams_and_updates_on_a_stand_in(tmp_path: Path) -> None:
    png = tmp_path / "grpo.png"
    command = [
        sys.executable,
        "examples/grpo_loop.py",
        "--stand-in",
        "--steps",
        "3",
        "--groups",
        "1",
        "--tokens",
        "8",
        "--png",
        str(png),
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    steps, summary = lines[:-1], lines[-1]["summary"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    # Every step trained on tokens of at most one version behind, and the trainer's own
    # log-probs of them, with the weights that made them, are the engine's.
    assert all(s["lag_max"] <= 1 and s["mismatch_tokens"] > 0 for s in steps)
    assert summary["mismatch_max"] < 1e-4
    assert all(0.0 <= s["reward"] <= 1.0 for s in steps)
    assert png.stat().st_size > 10_000
