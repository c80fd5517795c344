"""The transport benchmark still runs (a smoke run: one mode, two prompts); never timed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Engines and pools start once per mode: minutes on a loaded 2-core machine.
@pytest.mark.timeout(300)
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


# Engines and pools start once per mode: minutes on a loaded 2-core machine.
@pytest.mark.timeout(300)
def test_the_ltx_shaped_preset_runs_and_keeps_every_body_in_the_arena(tmp_path: Path) -> None:
    # The preset's shape (non-square latents, a 32x VAE, 3 SDE steps), shrunk: 1 prompt x 2
    # samples, 9 frames, 2 short steps.
    command = [
        sys.executable,
        "benchmarks/transport.py",
        "--preset",
        "ltx",
        "--modes",
        "msgpack-fetch",
        "--prompts",
        "1",
        "--samples-per-prompt",
        "2",
        "--frames",
        "9",
        "--steps",
        "2",
        "--step-latency-s",
        "0.01",
        "--handoff-mb",
        "8",
        "--out",
        str(tmp_path / "ltx.png"),
    ]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    # Each sample holds a [3, 9, 512, 768] bf16 video (latents 16 x 24, 32 pixels a cell):
    # the samples hold what the stand-in says it sent, in every mode.
    assert summary["workload"]["latent_width"] == 24
    assert summary["rollout_gb"] > 2 * 3 * 9 * 512 * 768 * 2 / 1e9
    for mode in summary["modes"]:
        assert mode["gb_delivered"] == summary["rollout_gb"], mode["mode"]
        assert (mode["arena_spills"], mode["pickled_bytes"], mode["failed_samples"]) == (0, 0, 0)


def test_only_the_default_run_replaces_the_readme_chart() -> None:
    spec = importlib.util.spec_from_file_location(
        "transport_bench", ROOT / "benchmarks/transport.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    assert bench.chart_path("default", None) == Path("benchmarks/transport.png")
    for preset in ("quick", "ltx"):
        assert bench.chart_path(preset, None).parent == Path(tempfile.gettempdir())
    assert bench.chart_path("quick", "here.png") == Path("here.png")


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
        "--chat-rounds",
        "2",
        "--turn-sweep",
        "4",
        "--agents-out-sessions",
        "2",
        "--chat-processes",
        "1",
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
        "agents-out@2",
        "agents-out-procs-latency@2",
    } <= set(modes)
    # The agents in their own process: every turn answered and recorded once (checked in
    # the run), the workers' CPU counted apart from the rollout's (the row has the figure;
    # four turns may take less CPU than the kernel's 10 ms accounting tick, so it may be 0).
    assert modes["agents-out-procs-latency@2"]["worker_cpu_ms_per_turn"] >= 0
    assert "worker_cpu_ms_per_turn" not in modes["agents-out-latency@2"]  # in-process
    assert modes["chat-latency@8"]["added_latency_p50_ms"] >= 0
    # The zero-latency chat rows: the median of three direct / session-server pairs, each
    # agent running two sessions back to back (every session checked closed with one
    # record a turn in the run); the latency rows stay one session an agent.
    for mode in ("chat-aiohttp@2", "aiohttp-direct@2", "chat-aiohttp-procs@2"):
        assert modes[mode]["requests"] == 2 * 2 * 2, mode
    assert modes["chat-latency@8"]["requests"] == 8 * 2
    # Their floor: the same agents through a proxy that does nothing, pairs as above.
    floor = modes["proxy-floor-aiohttp@2"]
    assert floor["requests"] == 2 * 2 * 2 and modes["aiohttp-direct-floor@2"]["requests"] == 8
    assert floor["pair_ratio_min"] <= floor["throughput_vs_direct"] <= floor["pair_ratio_max"]
    procs = modes["chat-aiohttp-procs@2"]
    assert procs["pair_ratio_min"] <= procs["throughput_vs_direct"] <= procs["pair_ratio_max"]
    assert (
        modes["generate@8"]["served_twice"] == 0 and modes["generate@8"]["throughput_vs_bare"] > 0
    )
    assert modes["stop@16"]["running_after"] == 0
    assert chart.stat().st_size > 10_000


def test_sessions_benchmark_counts_every_turn_once_and_sweeps_abandoned_sessions(
    tmp_path: Path,
) -> None:
    out = tmp_path / "sessions.json"
    command = [sys.executable, "benchmarks/sessions.py", "--quick", "--out", str(out)]
    run = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("{"))
    result = json.loads(line)["sessions"]
    assert json.loads(out.read_text()) == {"sessions": result}
    # Counters, not timings. --quick: 20 agents x 5 turns, every turn recorded once and
    # every turn after an agent's first sent as token in.
    (agents,) = result["agents"]
    counters = agents["counters"]
    assert (counters["recorded"], agents["records_returned"]) == (100, 100)
    assert (counters["token_in_turns"], counters["templated_turns"]) == (80, 20)
    assert (counters["open_sessions"], agents["tito_mismatches"]) == (0, 0)
    memory = result["memory"]
    assert memory["record_ids"] == memory["trajectory_tokens"] < memory["full_prompt_ids"]
    # 200 sessions abandoned (100 after a turn), after a warm-up wave of 200 closed ones
    # (each with a turn): the idle sweep expires every abandoned one.
    abandoned = result["abandoned"]["counters"]
    assert (abandoned["expired"], abandoned["open_sessions"], abandoned["closed"]) == (200, 0, 200)
    assert abandoned["recorded"] == 200 + 100
    alive = result["abandoned"]["turn_records_alive"]
    assert alive["after"] == alive["base"]
    degenerate = result["degenerate"]
    assert degenerate["unclosed"]["turns"] == 0 and degenerate["closed"]["turns"] == 1
    assert "| 1. 20 agents x 5 turns" in run.stdout


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


def test_the_text_layer_benchmark_refuses_fewer_than_one_chat_round() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/text_layer.py", "--chat-rounds", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert "--chat-rounds must be at least 1, got 0" in out.stderr


def test_prompts_benchmark_tokenizes_each_groups_prompt_once() -> None:
    command = [sys.executable, "benchmarks/prompts.py", "--quick"]
    run = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("{"))
    result = json.loads(line)
    # Counters, not timings (each sample's ids were checked by the run itself: the
    # prompt's ids, then the mock's answer).
    assert result["ids"]["tokenizer_calls_per_group"] == 0
    assert result["chat"]["tokenizer_calls_per_group"] == 1
    assert result["samples_per_group"] == 8 and result["groups"] == 64
    assert "chat / ids throughput" in run.stdout
