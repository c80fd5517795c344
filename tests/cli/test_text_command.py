"""``miles-lite text`` against a stand-in served by ``miles-lite serve`` in another process:
samples out as JSONL; mistakes end in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .conftest import cli, json_lines

QUESTIONS = [("What is 2 + 3? Box it.", "5"), ("What is 4 + 5? Box it.", "9"),
             ("What is 7 + 8? Box it.", "15")]  # fmt: skip


def prompt_file(tmp_path: Path, rows: list[dict[str, object]] | None = None) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = rows or [
        {"prompt": [{"role": "user", "content": q}], "label": a, "source": "demo"}
        for q, a in QUESTIONS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_text_rollout_writes_its_samples_as_jsonl(
    text_engine: str, tokenizer_dir: str, tmp_path: Path
) -> None:
    out = tmp_path / "samples.jsonl"
    trace = tmp_path / "t.json"
    run = cli(
        "text", "--engine-url", text_engine, "--tokenizer", tokenizer_dir,
        "--prompt-data", str(prompt_file(tmp_path)), "--output", str(out),
        "--n-samples-per-prompt", "4", "--max-new-tokens", "64", "--trace", str(trace),
        "--no-progress", "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = json_lines(run.stdout)
    assert line["metrics"]["rollout/samples"] == 12  # type: ignore[index]
    samples = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(samples) == 12 and {s["status"] for s in samples} == {"completed"}
    first = samples[0]
    assert first["label"] == "5" and first["metadata"] == {"source": "demo"}
    assert len(first["loss_mask"]) == len(first["rollout_log_probs"]) == first["response_length"]
    assert first["tokens"][-first["response_length"] :] and "boxed{" in first["response"]
    assert {s["reward"] for s in samples} <= {0.0, 1.0}
    assert json.loads(trace.read_text())["traceEvents"]
    assert "waiting for 1 engine(s) to answer /health: done" in run.stderr


def test_multi_turn_flags_run_tool_calls(
    text_engine: str, tokenizer_dir: str, tmp_path: Path
) -> None:
    prompts = prompt_file(tmp_path, [{"prompt": "Please add 2 and 3.", "label": "5"}])
    out = tmp_path / "samples.jsonl"
    run = cli(
        "text", "--engine-url", text_engine, "--tokenizer", tokenizer_dir,
        "--prompt-data", str(prompts), "--output", str(out), "--n-samples-per-prompt", "2",
        "--generate", "multi-turn", "--generate-tool-specs-path", "tests.cli.tools.tool_specs",
        "--generate-execute-tool-function-path", "tests.cli.tools.execute_tool",
        "--max-new-tokens", "64", "--no-progress",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    samples = [json.loads(x) for x in out.read_text().splitlines()]
    assert [s["turns"] for s in samples] == [1, 1]
    assert all(0 in s["loss_mask"] and s["reward"] == 1.0 for s in samples)
    assert "mask  log-prob" in run.stdout  # the sample printed side by side


def test_a_custom_agent_by_dotted_path_gets_the_scripted_answer(
    text_engine: str, tokenizer_dir: str, tmp_path: Path
) -> None:
    prompts = prompt_file(tmp_path, [{"prompt": "What is 2 + 3? Box it.", "label": "5"}])
    out = tmp_path / "samples.jsonl"
    run = cli(
        "text", "--engine-url", text_engine, "--tokenizer", tokenizer_dir,
        "--prompt-data", str(prompts), "--output", str(out), "--n-samples-per-prompt", "2",
        "--custom-agent-function-path", "tests.agentic.agents_plain.run_agent",
        "--session-processes", "0",  # served in the command's process: no worker to start
        "--max-new-tokens", "64", "--no-progress",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    samples = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(samples) == 2
    assert all("boxed{5}" in s["response"] or "boxed{6}" in s["response"] for s in samples)
    assert all(s["reward"] in (0.0, 1.0) and s["status"] == "completed" for s in samples)


def one_line(run: object) -> str:
    stderr = [line for line in run.stderr.splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert run.returncode == 2, run.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in run.stderr  # type: ignore[attr-defined]
    return stderr[-1]


def test_mistakes_end_in_one_line(text_engine: str, tokenizer_dir: str, tmp_path: Path) -> None:
    good = str(prompt_file(tmp_path))
    base = ["text", "--tokenizer", tokenizer_dir, "--no-progress"]
    started = time.monotonic()
    # Nothing listens on port 9: refused at once, then waited for --wait-for-engines.
    line = one_line(cli(*base, "--engine-url", "http://127.0.0.1:9", "--prompt-data", good,
                        "--wait-for-engines", "1"))  # fmt: skip
    assert "http://127.0.0.1:9" in line and "/health" in line
    assert time.monotonic() - started < 60  # seconds, not the two minutes it took
    # With the default wait, a refused connection is final; the hint is the command's flag.
    run = cli(*base, "--engine-url", "http://127.0.0.1:9", "--prompt-data", good)
    line = one_line(run)
    assert line == (
        "miles-lite text: nothing listens at http://127.0.0.1:9 (connection refused on"
        " /health); check --engine-url and that the server runs there (an engine still"
        " loading weights refuses connections, then answers 503: give it time with"
        " --wait-for-engines 600)"
    )
    assert "RouterConfig" not in run.stderr
    line = one_line(cli(*base, "--engine-url", "127.0.0.1:9", "--prompt-data", good))
    assert "'http://127.0.0.1:9'" in line
    line = one_line(
        cli(
            "text",
            "--tokenizer",
            str(tmp_path / "nope"),
            "--engine-url",
            text_engine,
            "--prompt-data",
            good,
        )
    )
    assert f"tokenizer from {tmp_path / 'nope'}: no such folder" in line
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    line = one_line(cli(*base, "--engine-url", text_engine, "--prompt-data", str(bad)))
    assert "bad.jsonl line 2 is not JSON" in line
    bad.write_text('{"prompt": "fine"}\n{"question": "where is the prompt?"}\n')
    line = one_line(cli(*base, "--engine-url", text_engine, "--prompt-data", str(bad)))
    assert "line 2 has no 'prompt' key" in line
    bad.write_text('{"prompt": "fine"}\n{"prompt": 42}\n')
    line = one_line(cli(*base, "--engine-url", text_engine, "--prompt-data", str(bad)))
    assert "bad.jsonl line 2: the prompt is int 42: expected a str" in line
    line = one_line(cli(*base, "--engine-url", text_engine, "--prompt-data", "missing.jsonl"))
    assert "cannot read the prompt file missing.jsonl" in line
