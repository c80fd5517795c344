"""CI runs the README's two commands as README.md writes them (read from it, never
restated), and the first one, the demo, in a clone and a venv with nothing else in them.
The run itself is CI's (.ci/run: minutes of installing); this holds the two together."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


def readme_commands() -> list[str]:
    """The lines of README.md's first ```bash block, read here independently of CI's awk."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("```bash") + 1
    return lines[start : lines.index("```", start)]


def ci_command(n: int) -> str:
    out = subprocess.run(
        [str(ROOT / ".ci" / "readme-command"), str(n)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.rstrip("\n")


def test_ci_reads_the_readme_commands_as_the_readme_writes_them() -> None:
    first, second = readme_commands()
    assert ci_command(1) == first and ci_command(2) == second
    assert first.endswith('pip install -e ".[demo]" && miles-lite demo')
    assert second.endswith('pip install -e ".[dev]" && python -m pytest')
    missing = subprocess.run(
        [str(ROOT / ".ci" / "readme-command"), "3"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 1 and "no command 3" in missing.stderr


def test_ci_runs_the_first_command_in_a_venv_of_its_own_and_checks_the_pictures(
    tmp_path: Path,
) -> None:
    script = CI.read_text()
    steps = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    # Neither command is restated: a copy would drift from the README.
    for command in readme_commands():
        assert command not in script
    assert 'eval "$(.ci/readme-command 2)"' in steps
    first = steps.index("\"( $(.ci/readme-command 1) ) 2>&1 | tee '$work/first-command.log'\"")
    # Right after the test command, in a clone of its own, with no venv of CI's active.
    assert steps.index('eval "$(.ci/readme-command 2)"') < first
    assert 'git clone --quiet "$repo" "$first"' in steps[:first]
    assert steps[first - 1] == 'env -u VIRTUAL_ENV PATH="$path0" bash -o pipefail -c \\'
    assert steps.index('path0="$PATH"  # before any venv is activated') < steps.index(
        'eval "$(.ci/readme-command 2)"'
    )
    # The demo says where its pictures went; CI finds them there.
    assert 'test -n "$out" && test -s "$out/text.png" && test -s "$out/diffusion.png"' in steps
    (parse,) = [line for line in steps if line.startswith('out="$(sed ')]
    log = tmp_path / "demo.log"
    log.write_text("  loading ...\noutput folder: /tmp/miles-lite-demo-x1 (traces and timelines)\n")
    parsed = subprocess.run(
        ["bash", "-c", f'work="{tmp_path}"; mv "{log}" "$work/first-command.log"; {parse}; echo "$out"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert parsed.stdout == "/tmp/miles-lite-demo-x1\n"
    syntax = subprocess.run(["bash", "-n", str(CI)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
