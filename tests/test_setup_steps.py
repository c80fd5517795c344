"""scripts/lib/steps.sh, the setup scripts' step runner: a finished step is reused, a failed
one fails loudly with its log's tail, and says so when the package registry is the cause."""

from __future__ import annotations

import subprocess
from pathlib import Path

STEPS = Path(__file__).resolve().parents[1] / "scripts" / "lib" / "steps.sh"


def run_steps(venv: Path, script: str) -> subprocess.CompletedProcess[str]:
    prelude = f'set -euo pipefail; VENV="{venv}"; STAMPS="$VENV/.stamps"; TAG=t; . "{STEPS}"; '
    return subprocess.run(
        ["bash", "-c", prelude + 'mkdir -p "$STAMPS"; ' + script],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_finished_step_is_reused_and_its_time_printed(tmp_path: Path) -> None:
    first = run_steps(tmp_path, 'step hello touch "$VENV/ran"')
    assert first.returncode == 0, first.stderr
    assert "hello" in first.stdout and "done in" in first.stdout
    (tmp_path / "ran").unlink()
    second = run_steps(tmp_path, 'step hello touch "$VENV/ran"')
    assert second.returncode == 0 and "reused" in second.stdout
    assert not (tmp_path / "ran").exists()


def test_an_unreachable_registry_fails_loudly_and_leaves_no_stamp(tmp_path: Path) -> None:
    script = (
        "step fetch sh -c 'echo \"ERROR: No matching distribution found for miles-rl\"; exit 1';"
        " echo not-reached"
    )
    failed = run_steps(tmp_path, script)
    assert failed.returncode == 1 and "not-reached" not in failed.stdout
    assert "No matching distribution" in failed.stderr  # the log's tail
    assert "package registry could not be reached" in failed.stderr
    assert not (tmp_path / ".stamps" / "fetch").exists()


def test_any_other_failure_names_the_step_and_its_log(tmp_path: Path) -> None:
    failed = run_steps(tmp_path, "step build sh -c 'echo boom; exit 3'")
    assert failed.returncode == 1
    assert "step build failed" in failed.stderr and ".setup-build.log" in failed.stderr
