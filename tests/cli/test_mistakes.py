"""Mistakes on the command line end in one line on stderr naming the flag, exit 2, and
every one that needs no I/O is said before any I/O: before the prompt file is read, the
tokenizer loads or an engine is asked (issue 30 B, D9-D12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_lite.cli import main
from miles_lite.cli.paths import CliError
from miles_lite.cli.text import load_prompts

from .conftest import cli

TEXT = ["text", "--engine-url", "http://127.0.0.1:9", "--tokenizer", "t", "--prompt-data", "p"]


def one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "usage:" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([*TEXT, "--reward", "mth"], "miles-lite text: argument --reward/--rm-type: invalid"
         " choice 'mth'; did you mean 'math'? (choose from math, deepscaler, dapo, f1, none)"),
        ([*TEXT, "--max-new-tokns", "5"],
         "miles-lite text: unknown flag --max-new-tokns; did you mean --max-new-tokens?"),
        # A prefix is not the flag (allow_abbrev=False): it was silently --max-new-tokens.
        ([*TEXT, "--max-new-token", "5"],
         "miles-lite text: unknown flag --max-new-token; did you mean --max-new-tokens?"),
        ([*TEXT, "--max-new-tokens=5", "--temprature=1"],
         "miles-lite text: unknown flag --temprature; did you mean --temperature?"),
        (["demo", "--agnt"], "miles-lite demo: unknown flag --agnt; did you mean --agent?"),
        (["txt"], "miles-lite: argument COMMAND: invalid choice 'txt'; did you mean 'text'?"
         " (choose from demo, text, diffusion, rollout, serve"),
        (["diffusion", "--engine-url", "http://h:1", "--transport", "pol"],
         "miles-lite diffusion: argument --transport: invalid choice 'pol'; did you mean"
         " 'pool'? (choose from pool, inline)"),
        ([*TEXT, "--custom-generate-function-path", "no_such_module.fn"], "miles-lite text:"
         " --custom-generate-function-path: cannot load 'no_such_module.fn': no module"
         " 'no_such_module'"),
        ([*TEXT, "stray"], "miles-lite text: unexpected argument 'stray' (see miles-lite text"
         " --help)"),
        (["text", "--engine-url", "http://h:1"], "miles-lite text: the following arguments are"
         " required: --tokenizer/--hf-checkpoint, --prompt-data"),
        ([*TEXT, "--temperature", "warm"], "miles-lite text: argument"
         " --temperature/--rollout-temperature: invalid float value: 'warm'"),
        ([*TEXT, "--session-processes", "many"], "miles-lite text: argument"
         " --session-processes: expected a number of worker processes or 'auto', got 'many'"),
    ],
)  # fmt: skip
def test_an_argparse_mistake_is_one_line_naming_the_flag(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert one_line_exit_2(argv, capsys).startswith(line)


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        # D9: was a 58-line traceback, exit 1.
        (["--engine-url", "http://::zz"], "--engine-url: engine URL 'http://::zz': the host"
         " and port do not parse (Port could not be cast to integer value as ':zz')"),
        (["--engine-url", "http://[::zz]:30000"], "--engine-url: engine URL"
         " 'http://[::zz]:30000': the host and port do not parse ('::zz' does not appear to be"
         " an IPv4 or IPv6 address)"),
        (["--engine-url", "127.0.0.1:9"], "write 'http://127.0.0.1:9'"),
        # D10: nan made every sample fail; the others ran and exited 0.
        (["--temperature", "nan"], "--temperature nan: TextSamplingParams.temperature must be"
         " a finite number >= 0, got nan"),
        (["--temperature", "-1"], "--temperature -1.0: TextSamplingParams.temperature must be"
         " a finite number >= 0, got -1.0"),
        (["--top-p", "2"], "--top-p 2.0: TextSamplingParams.top_p must be a finite number in"
         " (0, 1], got 2.0"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0: TextSamplingParams.max_new_tokens"
         " must be an int >= 1, got 0"),
        (["--seed", "-1"], "--seed -1: TextRolloutConfig.seed must be an int >= 0, got -1"),
        (["--generate", "multi-turn", "--generate-max-turns", "0"], "--generate-max-turns 0:"
         " MultiTurnOptions.max_turns must be an int >= 1, got 0"),
        # D12: was said only after the whole run, its results lost.
        (["--output", "/no/such/folder/samples.jsonl"], "--output /no/such/folder/samples.jsonl:"
         " cannot write there: the folder /no/such/folder does not exist"),
        (["--trace", "/tmp"], "--trace /tmp: is a folder; give a file path"),
    ],
)  # fmt: skip
def test_a_mistake_needing_no_io_is_said_before_any_io(
    flags: list[str], line: str, tmp_path: Path
) -> None:
    # Neither the prompt file nor the tokenizer exists: had anything been read or loaded
    # first, that would be the error.
    run = cli(
        "text", "--engine-url", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "tok"),
        "--prompt-data", str(tmp_path / "missing.jsonl"), *flags, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert lines == [f"miles-lite text: {lines[-1].removeprefix('miles-lite text: ')}"]
    assert line in lines[0] and "Traceback" not in run.stderr


def test_a_diffusion_mistake_is_said_before_torch_loads_anything(tmp_path: Path) -> None:
    run = cli("diffusion", "--engine-url", "http://[::zz]:1", "--prompt", "a cat", timeout=120)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr
    assert "--engine-url: engine URL 'http://[::zz]:1': the host and port do not" in run.stderr
    run = cli("diffusion", "--engine-url", "http://h:1", "--microgroup-size", "0", timeout=120)
    assert run.stderr.strip() == (
        "miles-lite diffusion: --microgroup-size 0: DiffusionRolloutConfig.microgroup_size"
        " must be an int >= 1, got 0"
    )
    run = cli(
        "diffusion", "--engine-url", "http://h:1", "--timeline", str(tmp_path / "no" / "t.png")
    )
    assert f"--timeline {tmp_path / 'no' / 't.png'}: cannot write there" in run.stderr


def test_a_binary_prompt_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(CliError) as caught:
        load_prompts(path, "prompt", "label")
    assert str(caught.value) == (
        f"{path} line 2 is not UTF-8 text (byte 0xff at column 13): a JSONL file is text"
    )


def test_a_deeply_nested_prompt_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(CliError, match=rf"^{path} line 2 is nested too deeply to read"):
        load_prompts(path, "prompt", "label")


def test_a_bad_prompt_file_ends_in_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    run = cli(
        "text", "--engine-url", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "tok"),
        "--prompt-data", str(path), timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"miles-lite text: {path} line 1 is not UTF-8 text (byte 0x89 at column 1): a JSONL"
        " file is text"
    )
