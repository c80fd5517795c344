"""The examples run as a user would run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tool_calling_example_prints_tokens_mask_and_log_probs() -> None:
    out = subprocess.run(
        [sys.executable, "examples/text_tool_calling.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "status completed, turns 1"
    rows = [line.split() for line in lines[2:]]
    masks = [int(r[2]) for r in rows]
    assert 0 in masks and masks[0] == 1 and masks[-1] == 1
    assert all(float(r[3]) == 0.0 for r in rows if r[2] == "0")
    assert any("<tool_response>" in line for line in lines)


def test_the_metrics_example_logs_every_rollout_to_tensorboard_and_a_dict_logger(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "examples/metrics_logging.py",
            "--logdir",
            str(tmp_path),
            "--rollouts",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == [0, 1]
    assert all(line["rollout/samples"] == 16 for line in lines)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"perf/rollout_time", "rollout/samples", "rollout/kept_groups"} <= tags
    assert [e.step for e in events.Scalars("rollout/samples")] == [0, 1]
    assert [e.value for e in events.Scalars("rollout/samples")] == [16.0, 16.0]
