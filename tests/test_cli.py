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


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "miles_lite.cli", "rollout", "--no-progress", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_flags_a_generate_function_registers_reach_it_as_options() -> None:
    out = demo(
        "--reward",
        "none",
        "--custom-generate-function-path",
        "tests.cli_generate.tagging_generate",
        "--tag",
        "from-the-cli",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["rollout/samples"] == 4
    assert "tag=from-the-cli" in out.stderr


def test_rollout_against_real_engines_refuses_a_random_clip_reward() -> None:
    out = rollout("--engine-url", "http://127.0.0.1:9", "--prompt", "a cat")
    assert out.returncode == 2
    assert "--clip-model" in out.stderr and "Traceback" not in out.stderr


def test_an_unreachable_engine_ends_with_one_clear_line() -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    out = rollout("--engine-url", "http://127.0.0.1:9", "--prompt", "a cat", "--reward", "mean")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "http://127.0.0.1:9" in lines[0] and "/health" in lines[0]
