from __future__ import annotations

import json
import subprocess
import sys

import pytest


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "miles_lite.cli",
        "demo",
        "--engines",
        "1",
        "--prompts",
        "2",
        "--samples-per-prompt",
        "2",
        "--steps",
        "2",
        "--latent-size",
        "8",
        "--no-progress",
        "--json",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--reward", "mean", "--fetch-in-parser"],
        ["--wire", "json", "--transport", "inline", "--reward", "none"],
    ],
)
def test_demo_runs_a_rollout_and_prints_its_metrics(options: list[str]) -> None:
    out = demo(*options)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["rollout/samples"] == 4 and metrics["rollout/failed_samples"] == 0
    assert metrics["perf/rollout_time"] > 0
    assert ("rollout/reward_mean" in metrics) == ("none" not in options)


def test_a_bad_flag_value_is_a_clear_usage_error() -> None:
    out = demo("--microgroup-size", "0")
    assert out.returncode == 2
    assert "microgroup_size" in out.stderr
