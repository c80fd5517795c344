"""``miles-lite demo``: every kind on stand-in engines, each with its metrics, a sample,
a trace and a timeline; mistakes end in one line."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import cli, json_lines

SMALL = ["--engines", "1", "--steps", "2", "--latent-size", "8", "--no-progress", "--json"]


def test_the_default_demo_shows_the_text_and_the_diffusion_half(tmp_path: Path) -> None:
    run = cli("demo", *SMALL, "--out-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    lines = {line["kind"]: line for line in json_lines(run.stdout)}
    assert set(lines) == {"text", "text, resumed", "diffusion"}
    text = lines["text"]["metrics"]
    # Dynamic sampling: 4 groups kept out of the 8 started at a time, groups whose rewards
    # all agree dropped, the rest left partial, then resumed first by the next rollout.
    assert text["rollout/kept_groups"] == 4 and text["rollout/partial_groups"] > 0  # type: ignore[index]
    assert text["rollout/dynamic_filter/drop_zero_std_1.0"] >= 1  # type: ignore[index]
    assert lines["text, resumed"]["metrics"]["rollout/kept_groups"] == 4  # type: ignore[index]
    diffusion = lines["diffusion"]["metrics"]
    assert diffusion["rollout/samples"] == 16 and diffusion["rollout/failed_samples"] == 0  # type: ignore[index]
    assert "rollout/reward_mean" in diffusion  # type: ignore[operator]
    for kind, stem in (("text", "text"), ("diffusion", "diffusion")):
        assert lines[kind]["trace"] == str(tmp_path / f"{stem}.trace.json")
        assert json.loads(Path(lines[kind]["trace"]).read_text())["traceEvents"]  # type: ignore[arg-type]
        assert Path(lines[kind]["timeline"]).stat().st_size > 10_000  # type: ignore[arg-type]
    # Each start-up step said what it did and how long it took.
    for step in ("starting stand-in engines (1 text, 1 diffusion)", "loading the Qwen3 tokenizer",
                 "starting reward pool 'math'", "starting the parser pool"):  # fmt: skip
        assert f"{step}" in run.stderr and "done in" in run.stderr, run.stderr


def test_tool_calling_and_agent_demos(tmp_path: Path) -> None:
    run = cli("demo", "--tools", "--agent", "--prompts", "2", *SMALL, "--out-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    lines = {line["kind"]: line["metrics"] for line in json_lines(run.stdout)}
    assert set(lines) == {"tools", "agent"}
    for metrics in lines.values():
        assert metrics["rollout/samples"] == 4 and metrics["rollout/failed_samples"] == 0  # type: ignore[index]
        assert metrics["rollout/reward_mean"] == 1.0  # type: ignore[index]
    assert (tmp_path / "agent.png").stat().st_size > 0


def test_the_table_shows_a_text_sample_side_by_side(tmp_path: Path) -> None:
    run = cli("demo", "--tools", "--prompts", "1", "--no-progress", "--out-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "== tools ==" in run.stdout and "rollout/reward_mean" in run.stdout
    assert "mask  log-prob  text" in run.stdout and "<tool_response>" in run.stdout
    assert f"timeline: {tmp_path / 'tools.png'}" in run.stdout


def test_flags_a_generate_function_registers_reach_it_as_options(tmp_path: Path) -> None:
    run = cli(
        "demo", "--diffusion", "--reward", "none", *SMALL, "--out-dir", str(tmp_path),
        "--custom-generate-function-path", "tests.support.cli_generate.tagging_generate",
        "--tag", "from-the-cli",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = json_lines(run.stdout)
    assert line["metrics"]["rollout/samples"] == 16  # type: ignore[index]
    assert "tag=from-the-cli" in run.stderr


def last_line(run: object) -> str:
    assert run.returncode == 2, run.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in run.stderr  # type: ignore[attr-defined]
    return [line for line in run.stderr.splitlines() if line.strip()][-1]  # type: ignore[attr-defined]


def test_a_bad_stand_in_or_rollout_value_is_one_line(tmp_path: Path) -> None:
    line = last_line(cli("demo", "--diffusion", "--channels", "0", "--out-dir", str(tmp_path)))
    assert "latent_channels" in line
    line = last_line(cli("demo", "--diffusion", "--microgroup-size", "0", "--engines", "1"))
    assert "microgroup_size" in line


def test_diffusion_against_real_engines_has_a_default_that_works_and_says_what_is_wrong() -> None:
    # The default reward (none) needs no checkpoint: the only mistake left is the URL.
    line = last_line(
        cli(
            "diffusion",
            "--engine-url",
            "http://127.0.0.1:9",
            "--prompt",
            "a cat",
            "--wait-for-engines",
            "1",
        )
    )
    assert "http://127.0.0.1:9" in line and "/health" in line
    line = last_line(
        cli(
            "rollout", "--engine-url", "http://127.0.0.1:9", "--prompt", "a cat", "--reward", "clip"
        )
    )
    assert "--clip-model" in line
