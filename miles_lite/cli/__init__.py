"""``miles-lite``: the command-line front end, the only place flags and dotted paths become
typed objects.

- ``miles-lite demo``: text and diffusion rollouts on stand-in engines (``--text``,
  ``--tools``, ``--agent``, ``--diffusion``, ``--all`` pick kinds);
- ``miles-lite text``: a text rollout against running engines, samples out as JSONL;
- ``miles-lite diffusion`` (alias ``rollout``): a diffusion rollout against running engines;
- ``miles-lite serve text|diffusion``: a stand-in engine on a port.
- ``miles-lite journal show|export|replay|audit run.db``: a rollout journal read back.

Commands import the library when they run: ``miles-lite --help`` imports nothing heavy.
A mistake (a bad flag value, an unreachable engine, a missing tokenizer or prompt file, a
reward that cannot load) ends in one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from miles_lite.cli._args import CommandParser, build_parser
from miles_lite.cli.paths import CliError, load_function, load_object
from miles_lite.errors import ConfigError

__all__ = ["CliError", "load_function", "load_object", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``miles-lite``; returns the exit status (0: every kept sample
    finished; 1: some failed; 2: a mistake, said in one line)."""
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(argv)
    command_parser = commands.get(args.command, parser)
    options: dict[str, Any] = {}
    generate = None
    path = getattr(args, "custom_generate_function_path", None)
    if path:
        try:
            generate = load_function(path)
        except ConfigError as exc:
            command_parser.error(f"--custom-generate-function-path: {exc}")
        options = _function_flags(generate, command_parser)
        args, extra = parser.parse_known_args(argv)
    if extra:
        # Said by the command's parser: it knows the command's flags (argparse's own
        # message is the top-level usage, with no "did you mean").
        if isinstance(command_parser, CommandParser):
            command_parser.unrecognized(extra)
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # The values of the generate function's own flags reach it as ``input.options``.
    options = {dest: getattr(args, dest) for dest in options}
    module = {"demo": "demo", "serve": "demo", "text": "text", "journal": "journal"}.get(
        args.command, "diffusion"
    )
    try:
        # Imported here: the library (torch, transformers, aiohttp) loads only when a
        # command runs.
        command = importlib.import_module(f"miles_lite.cli.{module}")
        return int(command.run(args, generate=generate, options=options))
    except (CliError, ConfigError) as exc:
        print(f"miles-lite {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"miles-lite {args.command}: interrupted", file=sys.stderr)
        return 130


def _function_flags(fn: Any, parser: Any) -> dict[str, None]:
    """Let ``fn.add_arguments(parser)`` register its flags (miles' contract); return their
    destinations."""
    add_arguments = getattr(fn, "add_arguments", None)
    if add_arguments is None:
        return {}
    before = {action.dest for action in parser._actions}
    add_arguments(parser)
    return {action.dest: None for action in parser._actions if action.dest not in before}
