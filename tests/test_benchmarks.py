"""The transport benchmark still runs (a smoke run: one mode, two prompts); never timed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_transport_benchmark_prints_its_table_json_and_chart(tmp_path: Path) -> None:
    chart = tmp_path / "transport.png"
    msgpack_modes = {"msgpack-pool", "msgpack-fetch", "msgpack-inline"}
    command = [
        sys.executable,
        "benchmarks/transport.py",
        "--quick",
        "--modes",
        ",".join(["json-inline", *sorted(msgpack_modes)]),
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
    assert set(modes) == {"json-inline", *msgpack_modes}
    assert all(m["failed_samples"] == 0 and m["gb_delivered"] > 0 for m in modes.values())
    # Counters, not timings: every msgpack mode hands every body over in the arena, in
    # every measured rollout of the run: no spill, no byte pickled.
    for name in msgpack_modes:
        assert (modes[name]["arena_spills"], modes[name]["pickled_bytes"]) == (0, 0), name
    assert modes["json-inline"]["speedup_vs_naive"] == 1.0
    assert "vs naive" in out.stdout and chart.stat().st_size > 10_000


def test_text_layer_benchmark_prints_its_table_json_and_chart(tmp_path: Path) -> None:
    chart = tmp_path / "text_layer.png"
    command = [
        sys.executable,
        "benchmarks/text_layer.py",
        "--requests",
        "64",
        "--concurrency",
        "8",
        "--latency-concurrency",
        "8",
        "--chat-sessions",
        "2",
        "--chat-turns",
        "2",
        "--turn-sweep",
        "4",
        "--stop-inflight",
        "16",
        "--png",
        str(chart),
        "--no-miles-peer",
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("{"))
    modes = {m["mode"]: m for m in json.loads(line)["text_layer"]}
    assert {
        "generate@8",
        "bare@8",
        "latency@8",
        "chat@2",
        "openai-direct@2",
        "chat-latency@8",
        "openai-direct-latency@8",
        "turns@4",
        "stop@16",
    } <= set(modes)
    assert modes["chat-latency@8"]["added_latency_p50_ms"] >= 0
    assert (
        modes["generate@8"]["served_twice"] == 0 and modes["generate@8"]["throughput_vs_bare"] > 0
    )
    assert modes["stop@16"]["running_after"] == 0
    assert chart.stat().st_size > 10_000


def test_a_quick_text_layer_run_never_writes_over_the_readme_chart() -> None:
    spec = importlib.util.spec_from_file_location("text_layer", ROOT / "benchmarks/text_layer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    readme_chart = ROOT / "benchmarks" / "text_layer.png"
    assert module.default_png(quick=False) == readme_chart
    assert module.default_png(quick=True).parent != readme_chart.parent
    assert "text_layer.png" in (ROOT / "README.md").read_text()
