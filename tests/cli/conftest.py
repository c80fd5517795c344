"""CLI tests run ``miles-lite`` as a user does: a separate process, against a stand-in
engine served by ``miles-lite serve`` in another one, reached by URL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``miles-lite ARGS`` (``python -m miles_lite.cli``) from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "miles_lite.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def json_lines(out: str) -> list[dict[str, object]]:
    """The JSON lines a ``--json`` run printed."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def text_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``miles-lite serve text --port 0`` in its own process; its URL."""
    log = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with (
        log.open("w") as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "miles_lite.cli", "serve", "text", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
        ) as process,
    ):
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # blocks until it serves (or exits)
            if "serving" not in line:
                pytest.fail(f"miles-lite serve did not start: {line!r} {log.read_text()[-2000:]}")
            yield line.split(" at ")[1].split(" ")[0]
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    """The real Qwen3 tokenizer's folder (shipped in a package)."""
    from miles_lite.testing import qwen3_tokenizer_dir

    return str(qwen3_tokenizer_dir())
