"""Flags and dotted paths become typed objects in the CLI, and only there; a path that does
not resolve is a ConfigError naming it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from miles_lite.agentic.agent import AgentGenerate
from miles_lite.agentic.config import SessionServerConfig
from miles_lite.cli import CliError, load_function, load_object
from miles_lite.cli._args import build_parser
from miles_lite.cli.text import build_config, build_filters, build_generate, build_rewards
from miles_lite.errors import ConfigError
from miles_lite.rewards.builtin import with_builtin_rewards
from miles_lite.rewards.text_rewards import math_reward
from miles_lite.text.benchmark import Benchmark
from miles_lite.text.multi_turn import MultiTurn
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.text.tool_calls import TOOL_CALL_PARSERS

from . import tools

BASE = ["text", "--engine-url", "http://127.0.0.1:9", "--tokenizer", "x", "--prompt-data", "p"]


def parse(*flags: str) -> object:
    parser, _ = build_parser()
    return parser.parse_args([*BASE, *flags])


@pytest.mark.parametrize("specs", ["tests.cli.tools.TOOLS", "tests.cli.tools.tool_specs"])
def test_multi_turn_flags_make_multi_turn_options(specs: str) -> None:
    args = parse(
        "--generate", "multi-turn",
        "--generate-max-turns", "3",
        "--generate-tool-specs-path", specs,
        "--generate-execute-tool-function-path", "tests.cli.tools.execute_tool",
        "--generate-tool-call-parser", "hermes",
        "--generate-tool-timeout-s", "7",
    )  # fmt: skip
    generate = build_generate(args)
    assert isinstance(generate, MultiTurn)
    options = generate.options
    assert options.max_turns == 3 and options.tool_timeout_s == 7.0
    assert options.tool_specs == tools.TOOLS
    assert options.execute_tool is tools.execute_tool
    assert options.parser is TOOL_CALL_PARSERS["hermes"]


def test_an_unknown_tool_call_parser_is_a_config_error_naming_it() -> None:
    args = parse("--generate", "multi-turn", "--generate-tool-call-parser", "nope")
    with pytest.raises(ConfigError, match=r"'nope'.*hermes"):
        build_generate(args)


def test_paths_that_do_not_resolve_are_config_errors_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"no_such_module.TOOLS.*no module 'no_such_module'"):
        build_generate(
            parse("--generate", "multi-turn", "--generate-tool-specs-path", "no_such_module.TOOLS")
        )
    with pytest.raises(ConfigError, match=r"tests.cli.tools.NOT_CALLABLE' is not callable"):
        build_generate(
            parse(
                "--generate",
                "multi-turn",
                "--generate-execute-tool-function-path",
                "tests.cli.tools.NOT_CALLABLE",
            )
        )
    with pytest.raises(ConfigError, match=r"module 'tests.cli.tools' has no 'missing'"):
        load_object("tests.cli.tools.missing")
    with pytest.raises(ConfigError, match=r"must be 'module.name'"):
        load_function("nodots")


def test_benchmark_flags_make_a_benchmark() -> None:
    generate = build_generate(
        parse("--generate", "benchmark", "--benchmark-min-new-tokens", "4",
              "--benchmark-max-new-tokens", "9")
    )  # fmt: skip
    assert isinstance(generate, Benchmark)
    assert (generate.min_new_tokens, generate.max_new_tokens) == (4, 9)
    with pytest.raises(ConfigError, match=r"min_new_tokens <= max_new_tokens"):
        build_generate(parse("--generate", "benchmark", "--benchmark-min-new-tokens", "99",
                             "--max-new-tokens", "8"))  # fmt: skip


def test_a_custom_agent_by_dotted_path_is_an_agent_generate() -> None:
    args = parse("--custom-agent-function-path", "tests.agentic.agents_plain.run_agent")
    assert isinstance(build_generate(args), AgentGenerate)
    assert build_generate(parse()) is single_turn


AGENT = ("--custom-agent-function-path", "tests.agentic.agents_plain.run_agent")


@pytest.mark.parametrize(("value", "processes"), [("0", 0), ("3", 3), ("auto", "auto")])
def test_session_processes_sets_the_agents_session_server(value: str, processes: int | str) -> None:
    generate = build_generate(parse(*AGENT, "--session-processes", value))
    assert isinstance(generate, AgentGenerate)
    assert generate.session_config == SessionServerConfig(processes=processes)  # type: ignore[arg-type]


def test_session_processes_the_config_refuses_or_without_an_agent_is_a_cli_error() -> None:
    message = r"^--session-processes -1: SessionServerConfig.processes must be an int >= 0"
    with pytest.raises(CliError, match=message):
        build_generate(parse(*AGENT, "--session-processes", "-1"))
    with pytest.raises(CliError, match=r"^--session-processes sets the session server of an"):
        build_generate(parse("--session-processes", "0"))


def test_rollout_flags_make_the_config_rewards_and_filters() -> None:
    args = parse(
        "--n-samples-per-prompt", "8", "--rollout-batch-size", "2",
        "--over-sampling-batch-size", "3", "--max-new-tokens", "16",
        "--max-inflight-per-engine", "5", "--wait-for-engines", "600",
        "--dynamic-filter", "drop_zero_std", "--rm-type", "math",
    )  # fmt: skip
    config = build_config(args)  # type: ignore[arg-type]
    assert config.n_samples_per_prompt == 8 and config.rollout_batch_size == 2
    assert config.over_sampling_batch_size == 3 and config.sampling.max_new_tokens == 16
    assert config.engines.router.max_inflight_per_engine == 5
    assert config.engines.router.ready_timeout_s == 600.0
    # A built-in name: the CLI keeps no table; the rollout's open() resolves it.
    assert build_rewards(args) == {} and config.reward == "math"  # type: ignore[arg-type]
    assert with_builtin_rewards(build_rewards(args), [config.reward]) == {"math": math_reward}  # type: ignore[arg-type]
    (check,) = build_filters(args)  # type: ignore[arg-type]
    assert callable(check)
    message = r"^--over-sampling-batch-size 2: TextRolloutConfig.over_sampling_batch_size \(2\)"
    with pytest.raises(CliError, match=message):
        build_config(parse("--rollout-batch-size", "4", "--over-sampling-batch-size", "2"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("command", "flag"), [("demo", "--agent"), ("text", "--top-p"),
                                              ("diffusion", "--arena-mb")])  # fmt: skip
def test_help_imports_nothing_heavy(command: str, flag: str) -> None:
    # No timing: what --help imported is what made it take 17.8 s on a loaded machine.
    # The defaults it shows come from a table, not from the config classes (torch).
    script = textwrap.dedent(
        f"""
        import sys
        from miles_lite.cli import main
        try:
            main(["{command}", "--help"])
        except SystemExit:
            pass
        heavy = sorted(m for m in ("torch", "transformers", "aiohttp", "numpy") if m in sys.modules)
        print("heavy:", heavy)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "heavy: []" in out.stdout
    assert flag in out.stdout and "``" not in out.stdout


def test_every_flag_says_what_it_is_for() -> None:
    _, commands = build_parser()
    for name, command in commands.items():
        for action in command._actions:
            if action.option_strings:
                assert action.help, f"miles-lite {name} {action.option_strings[0]} has no help"
                assert "``" not in action.help
