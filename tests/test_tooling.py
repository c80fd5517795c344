"""The linters run as part of the tests, so local checks and CI run the same commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_ruff_finds_nothing() -> None:
    lint = run("ruff", "check", "miles_lite", "tests", "benchmarks", "examples")
    assert lint.returncode == 0, lint.stdout[-4000:]
    fmt = run("ruff", "format", "--check", "miles_lite", "tests", "benchmarks", "examples")
    assert fmt.returncode == 0, fmt.stdout[-4000:]


def test_mypy_strict_passes_on_the_package() -> None:
    typed = run("mypy", "--no-incremental")
    assert typed.returncode == 0, typed.stdout[-4000:]
