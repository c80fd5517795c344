"""A real SIGKILL mid-generation, with and without streamed tokens in the journal: with
``stream_tokens_every=8`` each sample in flight resumes from its last recorded token (its
tokens extend that prefix), so the tokens made again after the kill are only those past
it; without, every sample in flight is generated again from its prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
TOKENS = 64  # stream_kill_child.TOKENS: every sample is truncated there
KILL_AT = 96  # output tokens the engine made in all when the child kills itself


def child(*args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, str(HERE / "stream_kill_child.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-3000:]
    return out.returncode, json.loads(lines[-1])


def crash_and_resume(journal: Path, every: int) -> tuple[dict[str, Any], dict[str, Any]]:
    code, crash = child("crash", "--journal", str(journal), "--every", str(every))
    assert code == -9  # SIGKILLed itself mid-generation
    assert crash["made"] >= KILL_AT
    code, resume = child("resume", "--journal", str(journal))
    assert code == 0
    # Every sample ends whole, extending what the journal had of it.
    assert resume["lengths"] == resume["log_probs"] == [TOKENS] * 4
    for tokens, prefix in zip(resume["tokens"], resume["prefixes"], strict=True):
        assert tokens[: len(prefix)] == prefix
    # The engine made exactly what was missing.
    assert resume["generated"] == 4 * TOKENS - sum(resume["kept"])
    return crash, resume


@pytest.mark.slow
def test_streamed_tokens_cut_what_a_sigkill_makes_generate_again(tmp_path: Path) -> None:
    crash, streamed = crash_and_resume(tmp_path / "streamed.db", every=8)
    assert crash["progress"] >= 8
    # Chunks hold 1 token, then 8 more each (as SGLang's): records at 9, 17, ...
    assert all(n >= 9 and n % 8 == 1 for n in streamed["kept"])
    again_streamed = crash["made"] - sum(streamed["kept"])

    crash_off, plain = crash_and_resume(tmp_path / "plain.db", every=0)
    assert crash_off["progress"] == 0 and plain["kept"] == [0, 0, 0, 0]
    again_plain = crash_off["made"]  # all of it made again

    # Each sample loses the tokens since its last record (fewer than 8) and those of
    # records the kill caught queued.
    print(f"made again after the kill: {again_streamed} streamed, {again_plain} without")
    assert 0 <= again_streamed < again_plain
