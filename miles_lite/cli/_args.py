"""The ``miles-lite`` command line: every command and flag, with the standard library only
(so ``miles-lite --help`` answers at once; the commands import the library when run).

The command line owns no library default: a flag the user did not give is ``None`` and
never reaches a config class, which owns the default. ``--help`` shows those defaults
from :data:`CONFIG_DEFAULTS` (importing the config classes would import torch), which a
test holds equal to the classes' field defaults.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["CONFIG_DEFAULTS", "CommandParser", "build_parser"]

#: What ``--help`` shows for the flags whose value a config class owns, by command and
#: destination; the flags themselves default to ``None`` (not given). A test holds each
#: to the field default of the class that owns it (``tests/cli/test_defaults.py``).
CONFIG_DEFAULTS: dict[str, dict[str, object]] = {
    "text": {
        "samples_per_prompt": 4,  # RolloutConfig.n_samples_per_prompt
        "seed": 0,  # RolloutConfig.seed
        "reward_workers": 1,  # RolloutConfig.reward_workers
        "max_inflight_per_engine": 256,  # TextRolloutConfig.engines.router
        "wait_for_engines": 5.0,  # RouterConfig.ready_timeout_s
        "max_new_tokens": 1024,  # TextSamplingParams
        "temperature": 1.0,
        "top_p": 1.0,
        "generate_max_turns": 16,  # MultiTurnOptions
        "generate_tool_call_parser": "qwen",
        "generate_tool_timeout_s": 30.0,
        "benchmark_min_new_tokens": 1,  # Benchmark
        "session_processes": "auto",  # SessionServerConfig.processes
    },
    "diffusion": {
        "samples_per_prompt": 4,
        "seed": 0,
        "reward_workers": 1,
        "max_inflight_per_engine": 4,  # DiffusionRolloutConfig.engines.router
        "wait_for_engines": 5.0,
        "microgroup_size": 2,  # DiffusionRolloutConfig
        "transport": "pool",
        "parser_workers": 2,  # ParserPoolConfig.workers
        "arena_mb": 1024,  # ArenaConfig.size_bytes >> 20
    },
}
#: The demo has no engine flags, and its samples per prompt depend on the kind.
CONFIG_DEFAULTS["demo"] = {
    k: v
    for k, v in CONFIG_DEFAULTS["diffusion"].items()
    if k not in ("samples_per_prompt", "max_inflight_per_engine", "wait_for_engines")
}


def _count_or_auto(text: str) -> int | str:
    """A ``--session-processes`` value: ``auto`` or a whole number (the config class
    judges its range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of worker processes or 'auto', got {text!r}"
        ) from None


def _default(command: str, dest: str) -> str:
    """`` (default X)`` for the help of a flag whose default a config class owns."""
    value = CONFIG_DEFAULTS[command][dest]
    return f" (default {value:g})" if isinstance(value, float) else f" (default {value})"


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line on stderr, naming the flag and the
    nearest valid flag or choice, with exit status 2 (no usage block); prefixes of long
    flags are not taken for the flag (``allow_abbrev=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE`` on one line on stderr and exit 2."""
        self.exit(2, f"{self.prog}: {' '.join(message.split())}\n")

    def unrecognized(self, extra: Sequence[str]) -> NoReturn:
        """The one-line error for arguments this command does not take: the first unknown
        flag and the nearest flag it has, if one is close."""
        flags = [s for s in extra if s.startswith("-")]
        if not flags:
            self.error(f"unexpected argument {extra[0]!r} (see {self.prog} --help)")
        flag = flags[0].split("=", 1)[0]
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (see {self.prog} --help)"
        self.error(f"unknown flag {flag}{hint}")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's message lists the choices only; add the nearest one.
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise argparse.ArgumentError(
            action, f"invalid choice {value!r}{hint} (choose from {', '.join(names)})"
        )


DESCRIPTION = """\
miles_lite: the rollout layer of RL post-training, without Ray.

  miles-lite demo                    text and diffusion rollouts on stand-in engines
  miles-lite demo --agent            one kind: --text, --tools, --agent, --diffusion (--all)
  miles-lite text --engine-url URL --tokenizer DIR --prompt-data prompts.jsonl --output out.jsonl
  miles-lite diffusion --engine-url URL --prompt "a cat"
  miles-lite serve text --port 30000 a stand-in engine to point the commands at
"""


def _run_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Flags every rollout command has."""
    shown = CONFIG_DEFAULTS[command]
    g = parser.add_argument_group("rollout")
    g.add_argument(
        "--n-samples-per-prompt",
        "--samples-per-prompt",
        dest="samples_per_prompt",
        type=int,
        default=None,
        help="samples per prompt, a group"
        + (_default(command, "samples_per_prompt") if "samples_per_prompt" in shown else ""),
    )
    g.add_argument(
        "--rollout-batch-size",
        type=int,
        default=None,
        help="groups to keep; the rollout stops once that many passed the filters",
    )
    g.add_argument(
        "--over-sampling-batch-size",
        type=int,
        default=None,
        help="groups started at a time while more are needed (default: --rollout-batch-size)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        help="base seed of the samples' seeds" + _default(command, "seed"),
    )
    g.add_argument(
        "--reward-workers",
        type=int,
        default=None,
        help="processes of each reward pool" + _default(command, "reward_workers"),
    )
    g.add_argument(
        "--custom-generate-function-path",
        default=None,
        metavar="MODULE.FN",
        help="a generate function; its add_arguments(parser) flags reach it as input.options",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="write the rollout as a Chrome/Perfetto trace (JSON) here",
    )
    out.add_argument(
        "--timeline",
        default=None,
        metavar="PATH",
        help="draw the rollout's timeline as a PNG here (needs matplotlib)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON line per rollout"
    )
    out.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop")


def _engine_flags(parser: argparse.ArgumentParser, command: str) -> None:
    g = parser.add_argument_group("engines")
    g.add_argument(
        "--engine-url",
        action="append",
        required=True,
        metavar="URL",
        help="an engine, http://host:port (repeat for several)",
    )
    g.add_argument(
        "--max-inflight-per-engine",
        "--sglang-server-concurrency",
        dest="max_inflight_per_engine",
        type=int,
        default=None,
        help="requests each engine takes at once" + _default(command, "max_inflight_per_engine"),
    )
    g.add_argument(
        "--wait-for-engines",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the engines to answer /health; an engine still loading"
        " weights refuses connections, which only a wait over 5 s waits out (600 for"
        " such engines)" + _default(command, "wait_for_engines"),
    )


def _text_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("text")
    g.add_argument(
        "--max-new-tokens",
        "--rollout-max-response-len",
        dest="max_new_tokens",
        type=int,
        default=None,
        help="output tokens per sample at most" + _default("text", "max_new_tokens"),
    )
    g.add_argument(
        "--temperature",
        "--rollout-temperature",
        dest="temperature",
        type=float,
        default=None,
        help="sampling temperature, >= 0" + _default("text", "temperature"),
    )
    g.add_argument(
        "--top-p",
        "--rollout-top-p",
        dest="top_p",
        type=float,
        default=None,
        help="nucleus sampling: the smallest set of tokens holding this probability, in"
        " (0, 1]" + _default("text", "top_p"),
    )
    g.add_argument(
        "--max-context-len",
        "--rollout-max-context-len",
        dest="max_context_len",
        type=int,
        default=None,
        help="the engines' context (prompt + output); longer prompts are never sent",
    )
    g.add_argument(
        "--reward",
        "--rm-type",
        dest="reward",
        choices=["math", "deepscaler", "dapo", "f1", "none"],
        default="math",
        help="rule-based reward of the samples against their label (default math)",
    )
    g.add_argument(
        "--reward-function-path",
        default=None,
        metavar="MODULE.FN",
        help="your reward: (samples) -> list of floats, run in the reward pool",
    )
    g.add_argument(
        "--dynamic-filter",
        action="append",
        choices=["drop_zero_std", "drop_failed", "drop_aborted"],
        default=None,
        help="drop finished groups (repeatable): drop_zero_std keeps groups whose rewards differ",
    )
    g.add_argument(
        "--dynamic-sampling-filter-path",
        default=None,
        metavar="MODULE.FN",
        help="your filter: (group) -> bool or FilterResult",
    )
    gen = parser.add_argument_group("generate functions")
    gen.add_argument(
        "--generate",
        choices=["single-turn", "multi-turn", "benchmark"],
        default="single-turn",
        help="single-turn /generate, multi-turn tool calling, or random output lengths",
    )
    gen.add_argument(
        "--generate-max-turns",
        type=int,
        default=None,
        help="multi-turn: turns" + _default("text", "generate_max_turns"),
    )
    gen.add_argument(
        "--generate-tool-specs-path",
        default=None,
        metavar="MODULE.NAME",
        help="multi-turn: OpenAI tool specs (a list, or a function returning one)",
    )
    gen.add_argument(
        "--generate-execute-tool-function-path",
        default=None,
        metavar="MODULE.FN",
        help="multi-turn: async (name, arguments) -> str",
    )
    gen.add_argument(
        "--generate-tool-call-parser",
        default=None,
        help="multi-turn: qwen, qwen25 or hermes" + _default("text", "generate_tool_call_parser"),
    )
    gen.add_argument(
        "--generate-tool-timeout-s",
        type=float,
        default=None,
        help="multi-turn: bound per tool, seconds" + _default("text", "generate_tool_timeout_s"),
    )
    gen.add_argument(
        "--benchmark-min-new-tokens",
        type=int,
        default=None,
        help="benchmark" + _default("text", "benchmark_min_new_tokens"),
    )
    gen.add_argument(
        "--benchmark-max-new-tokens",
        type=int,
        default=None,
        help="benchmark (default --max-new-tokens)",
    )
    gen.add_argument(
        "--custom-agent-function-path",
        default=None,
        metavar="MODULE.FN",
        help="an agent: async (base_url, messages, request_kwargs); it chats through a session URL",
    )
    gen.add_argument(
        "--session-processes",
        type=_count_or_auto,
        default=None,
        metavar="N",
        help="an agent: worker processes serving its sessions, 'auto' (one per spare core, 1"
        " to 4) or 0 (in this process)" + _default("text", "session_processes"),
    )


def _diffusion_flags(parser: argparse.ArgumentParser, command: str) -> None:
    demo = command == "demo"
    g = parser.add_argument_group("diffusion")
    g.add_argument(
        "--microgroup-size",
        type=int,
        default=None,
        help="samples per request" + _default(command, "microgroup_size"),
    )
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help="num_inference_steps (default: the engine's, for its model)",
    )
    g.add_argument(
        "--transport",
        choices=["pool", "inline"],
        default=None,
        help="decode bodies in the parser pool, or on the event loop"
        + _default(command, "transport"),
    )
    g.add_argument("--fetch-in-parser", action="store_true", help="parser workers fetch the bodies")
    g.add_argument(
        "--parser-workers",
        type=int,
        default=None,
        help="parser pool processes" + _default(command, "parser_workers"),
    )
    g.add_argument(
        "--arena-mb",
        type=int,
        default=None,
        help="shared-memory arena (MiB)" + _default(command, "arena_mb"),
    )
    g.add_argument(
        "--reward",
        choices=["clip", "mean", "none"],
        default="clip" if demo else "none",
        help="clip: a PickScore-style CLIP reward (a tiny random CLIP in the demo;"
        " give --clip-model for real engines); mean: the output's mean value",
    )
    g.add_argument("--clip-model", default=None, metavar="DIR", help="a CLIP/PickScore checkpoint")
    g.add_argument(
        "--clip-tokenizer", default=None, metavar="DIR", help="its tokenizer (default --clip-model)"
    )
    g.add_argument(
        "--reward-function-path",
        default=None,
        metavar="MODULE.FN",
        help="your reward: (samples) -> list of floats",
    )


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``miles-lite`` parser and each command's parser by name."""
    parser = CommandParser(
        prog="miles-lite",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="rollouts of every kind on stand-in engines: no GPU, no server",
        description="Rollouts on stand-in SGLang engines started on loopback. With no kind"
        " flag: a text rollout (math reward, dynamic sampling) and a diffusion rollout.",
    )
    kinds = demo.add_argument_group("kinds (default: --text --diffusion)")
    kinds.add_argument("--text", action="store_true", help="/generate, math reward, early stop")
    kinds.add_argument("--tools", action="store_true", help="multi-turn tool calling")
    kinds.add_argument("--agent", action="store_true", help="an openai agent through sessions")
    kinds.add_argument("--diffusion", action="store_true", help="diffusion: parser and CLIP pools")
    kinds.add_argument("--all", action="store_true", help="every kind")
    demo.add_argument(
        "--prompts", type=int, default=None, help="prompts per rollout (default: per kind)"
    )
    demo.add_argument(
        "--out-dir",
        default=None,
        metavar="DIR",
        help="where traces and timelines go (default: a miles-lite-demo folder in the temp dir)",
    )
    _run_flags(demo, "demo")
    e = demo.add_argument_group("stand-in engines")
    e.add_argument("--engines", type=int, default=2, help="diffusion stand-ins")
    e.add_argument("--latent-size", type=int, default=32, help="latent height and width")
    e.add_argument("--channels", type=int, default=4, help="latent channels")
    e.add_argument("--frames", type=int, default=1, help=">1 gives video-shaped 5-D latents")
    e.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="bfloat16",
        help="latents' dtype",
    )
    e.add_argument("--step-latency", type=float, default=0.02, help="seconds per denoising step")
    e.add_argument("--engine-concurrency", type=int, default=4, help="requests generating at once")
    e.add_argument(
        "--wire",
        choices=["msgpack", "json"],
        default="msgpack",
        help="msgpack: SGLang >= 0.5.19; json: base64 tensors of <= 0.5.15",
    )
    e.add_argument(
        "--token-latency",
        type=float,
        default=0.004,
        help="text stand-in: seconds per output token",
    )
    _diffusion_flags(demo, "demo")

    text = sub.add_parser(
        "text",
        help="a text rollout against running SGLang engines; samples out as JSONL",
        description="A text rollout (/generate single or multi turn, or an agent) against"
        " running engines. Prompts: a JSONL file, one object per line with the prompt (a"
        " string or a chat messages list) under --input-key and the label under --label-key.",
    )
    _engine_flags(text, "text")
    t = text.add_argument_group("data")
    t.add_argument(
        "--tokenizer",
        "--hf-checkpoint",
        dest="tokenizer",
        required=True,
        metavar="DIR",
        help="the model's tokenizer (a folder or a hub id transformers can load)",
    )
    t.add_argument(
        "--prompt-data",
        required=True,
        metavar="FILE",
        help="prompts, JSONL: a string prompt is sent as it is (no chat template); a"
        " messages list goes through the tokenizer's chat template",
    )
    t.add_argument(
        "--input-key", default="prompt", help="the prompt's key in each line (default prompt)"
    )
    t.add_argument(
        "--label-key", default="label", help="the label's key in each line (default label)"
    )
    t.add_argument("--output", default=None, metavar="FILE", help="write the samples here as JSONL")
    _run_flags(text, "text")
    _text_flags(text)

    diffusion = sub.add_parser(
        "diffusion",
        aliases=["rollout"],
        help="a diffusion rollout against running SGLang-diffusion engines",
    )
    _engine_flags(diffusion, "diffusion")
    d = diffusion.add_argument_group("data")
    d.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    d.add_argument("--width", type=int, default=None, help="image width (the model's default)")
    d.add_argument("--height", type=int, default=None, help="image height (the model's default)")
    d.add_argument("--num-frames", type=int, default=None, help="video frames (video models)")
    _run_flags(diffusion, "diffusion")
    _diffusion_flags(diffusion, "diffusion")

    serve = sub.add_parser(
        "serve",
        help="serve a stand-in engine (text or diffusion) on a port, to try the commands",
        description="Serves a stand-in SGLang engine on loopback until Ctrl-C. The text one"
        " answers arithmetic prompts (\\boxed{} answers, an add tool) with the real Qwen3"
        " tokenizer; the diffusion one answers /rollout/generate with synthetic latents.",
    )
    serve.add_argument("kind", choices=["text", "diffusion"])
    serve.add_argument("--port", type=int, default=30000, help="0: any free port")
    serve.add_argument("--token-latency", type=float, default=0.004, help="text: s per token")
    serve.add_argument("--step-latency", type=float, default=0.02, help="diffusion: s per step")
    commands = {"demo": demo, "text": text, "diffusion": diffusion, "rollout": diffusion}
    from miles_lite.cli.journal import add_journal_parser

    return parser, {**commands, "serve": serve, "journal": add_journal_parser(sub)}
