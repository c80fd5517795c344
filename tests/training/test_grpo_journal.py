"""The GRPO example with --journal: run again on the same file, it goes on from the last
committed step (its model and optimizer from the checkpoint beside the journal), and every
step it committed replays bit for bit with no engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_lite.training import read_resume, replay_step

ROOT = Path(__file__).resolve().parents[2]


def grpo(journal: Path, steps: int) -> list[dict[str, float]]:
    command = [
        sys.executable,
        "examples/grpo_loop.py",
        "--stand-in",
        *("--steps", str(steps), "--groups", "1", "--tokens", "8"),
        *("--journal", str(journal)),
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return lines[:-1]


@pytest.mark.slow
def test_the_grpo_example_goes_on_from_its_journal(tmp_path: Path) -> None:
    journal = tmp_path / "run.db"
    assert [r["step"] for r in grpo(journal, 2)] == [1, 2]
    assert [r["step"] for r in grpo(journal, 4)] == [3, 4]  # not 1 and 2 again
    state = read_resume(journal)
    assert state.step == 4 and state.handed == []
    assert sorted(state.committed_prompts) == ["0", "1", "2", "3"]
    assert all(replay_step(journal, step).matches for step in range(1, 5))
    assert all((tmp_path / f"run.db.step{step}.pt").is_file() for step in range(1, 5))
