"""The command line owns no library default (issue 34.1): a flag not given is None and
never reaches a config class; --help shows each default as the class that owns it has it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from miles_lite.agentic.agent import AgentGenerate
from miles_lite.cli._args import CONFIG_DEFAULTS, build_parser
from miles_lite.cli.config_flags import (
    DIFFUSION_FIELDS,
    MULTI_TURN_FIELDS,
    SESSION_FIELDS,
    TEXT_FIELDS,
)
from miles_lite.cli.diffusion import build_config as diffusion_config
from miles_lite.cli.text import build_config as text_config
from miles_lite.cli.text import build_generate
from miles_lite.diffusion.config import DiffusionRolloutConfig
from miles_lite.pools.arena import ArenaConfig
from miles_lite.text.benchmark import Benchmark
from miles_lite.text.config import TextRolloutConfig
from miles_lite.text.multi_turn import MultiTurn
from miles_lite.text.tool_calls import TOOL_CALL_PARSERS

TEXT = ["text", "--engine-url", "http://127.0.0.1:9", "--tokenizer", "t", "--prompt-data", "p"]
DIFFUSION = ["diffusion", "--engine-url", "http://127.0.0.1:9"]
#: Defaults the command line owns: which reward or generate function to build, the keys of
#: its own prompt file. Anything else with a default would be a second owner.
CLI_OWNED = {"reward", "generate", "input_key", "label_key", "help"}


def parse(*argv: str) -> argparse.Namespace:
    parser, _ = build_parser()
    return parser.parse_args(list(argv))


def at(config: object, path: str) -> object:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def test_flags_not_given_do_not_reach_the_configs() -> None:
    # The config built from no flags is the classes' own default, field for field.
    assert text_config(parse(*TEXT)) == TextRolloutConfig(reward="math")
    assert diffusion_config(parse(*DIFFUSION)) == DiffusionRolloutConfig()
    assert diffusion_config(parse(*DIFFUSION)).parser.arena == ArenaConfig()  # 1 GiB, not 256 MiB


@pytest.mark.parametrize("command", ["text", "diffusion"])
def test_no_flag_has_a_default_a_config_class_owns(command: str) -> None:
    _, commands = build_parser()
    for action in commands[command]._actions:
        if action.default not in (None, False, argparse.SUPPRESS):
            assert action.dest in CLI_OWNED, (action.option_strings, action.default)


@pytest.mark.parametrize("command", sorted(CONFIG_DEFAULTS))
def test_help_shows_the_defaults_it_has_from_the_table(command: str) -> None:
    _, commands = build_parser()
    actions = {a.dest: a for a in commands[command]._actions}
    for dest, value in CONFIG_DEFAULTS[command].items():
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert actions[dest].default is None, dest
        assert f"(default {shown})" in (actions[dest].help or ""), dest


def test_the_text_defaults_help_shows_are_the_configs() -> None:
    shown = CONFIG_DEFAULTS["text"]
    config = text_config(parse(*TEXT))
    for dest, value in shown.items():
        if dest in TEXT_FIELDS:
            assert at(config, TEXT_FIELDS[dest].path) == value, dest
    multi = build_generate(parse(*TEXT, "--generate", "multi-turn"))
    assert isinstance(multi, MultiTurn)
    assert multi.options.parser is TOOL_CALL_PARSERS[str(shown["generate_tool_call_parser"])]
    bench = build_generate(parse(*TEXT, "--generate", "benchmark"))
    assert isinstance(bench, Benchmark)
    assert bench.min_new_tokens == shown["benchmark_min_new_tokens"]
    assert bench.max_new_tokens == config.sampling.max_new_tokens
    for dest, field in MULTI_TURN_FIELDS.items():
        assert at(multi.options, field.path) == shown[dest], dest
    agent = build_generate(
        parse(*TEXT, "--custom-agent-function-path", "tests.agentic.agents_plain.run_agent")
    )
    assert isinstance(agent, AgentGenerate)
    for dest, field in SESSION_FIELDS.items():
        assert at(agent.session_config, field.path) == shown[dest], dest
    covered = {*TEXT_FIELDS, *MULTI_TURN_FIELDS, *SESSION_FIELDS, "generate_tool_call_parser"}
    assert set(shown) <= covered | {"benchmark_min_new_tokens"}


def test_the_diffusion_defaults_help_shows_are_the_configs() -> None:
    for command, argv in (("diffusion", DIFFUSION), ("demo", ["demo"])):
        config = diffusion_config(parse(*argv))
        for dest, value in CONFIG_DEFAULTS[command].items():
            field = DIFFUSION_FIELDS[dest]
            expected = value if field.convert is None else field.convert(value)
            assert at(config, field.path) == expected, (command, dest)


def test_a_given_flag_changes_only_its_field() -> None:
    config = diffusion_config(parse(*DIFFUSION, "--arena-mb", "64", "--wait-for-engines", "600"))
    default = DiffusionRolloutConfig()
    assert config.parser.arena is not None and config.parser.arena.size_bytes == 64 << 20
    assert config.engines.router.ready_timeout_s == 600.0
    # The kind's own in-flight default (4 per engine) survives a change to its router.
    assert config.engines.router.max_inflight_per_engine == 4
    assert (
        dataclasses.replace(
            config,
            parser=default.parser,
            engines=dataclasses.replace(config.engines, router=default.engines.router),
        )
        == default
    )
