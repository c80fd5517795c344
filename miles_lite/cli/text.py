"""``miles-lite text``: flags -> a text rollout against running engines -> samples as JSONL.

Every flag becomes a typed object here (:func:`build_config`, :func:`build_generate`,
:func:`build_rewards`, :func:`build_filters`); prompt files and tokenizers are read with
one-line errors naming the file, the line and what was wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miles_lite.cli.config_flags import (
    MULTI_TURN_FIELDS,
    SESSION_FIELDS,
    TEXT_FIELDS,
    apply_flags,
    given,
)
from miles_lite.cli.paths import CliError, load_function, load_object, one_line_errors
from miles_lite.cli.preflight import check_engine_urls, check_outputs
from miles_lite.cli.report import report, say_startup_steps, write_pictures
from miles_lite.errors import ConfigError
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.filters import GroupFilter, drop_aborted, drop_failed, drop_zero_std
from miles_lite.rollout.groups import PromptGroup, check_prompts
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.startup import startup_step
from miles_lite.sglang.sampling import TextSamplingParams
from miles_lite.text.config import TextRolloutConfig
from miles_lite.types import Sample

__all__ = [
    "build_config",
    "build_filters",
    "build_generate",
    "build_rewards",
    "load_prompts",
    "load_tokenizer",
    "rollout",
    "run",
    "sample_record",
]

#: The built-in dynamic filters by name (drop_zero_std as miles' DAPO filter).
_FILTERS: dict[str, GroupFilter] = {
    "drop_zero_std": drop_zero_std(),
    "drop_failed": drop_failed,
    "drop_aborted": drop_aborted,
}


def build_config(args: argparse.Namespace) -> TextRolloutConfig:
    """The rollout's config: :class:`TextRolloutConfig`'s defaults with the flags the user
    gave (:data:`~miles_lite.cli.config_flags.TEXT_FIELDS`); :class:`CliError` naming a
    flag whose value the config refuses. No I/O."""
    config = TextRolloutConfig(reward=_reward_kind(args))
    return apply_flags(config, given(args, TEXT_FIELDS))


def build_generate(args: argparse.Namespace, custom: GenerateFn | None = None) -> GenerateFn:
    """The generate function the flags name: a custom one, an agent
    (``AgentGenerate`` of ``--custom-agent-function-path``, its session server's config
    from the ``--session-*`` flags), ``MultiTurn``, ``Benchmark``, or single turn.
    ``ConfigError`` names a path or parser that does not resolve; :class:`CliError` a
    session flag without an agent, or a value the session server's config refuses."""
    from miles_lite.text.single_turn import generate as single_turn

    session_flags = given(args, SESSION_FIELDS)
    if session_flags and (custom is not None or not args.custom_agent_function_path):
        raise CliError(
            f"{session_flags[0][0].flag} sets the session server of an agent: give"
            " --custom-agent-function-path too"
        )
    if custom is not None:
        return custom
    if args.custom_agent_function_path:
        from miles_lite.agentic.agent import AgentGenerate
        from miles_lite.agentic.config import SessionServerConfig

        sessions = apply_flags(SessionServerConfig(), session_flags)
        return AgentGenerate(load_function(args.custom_agent_function_path), sessions=sessions)
    if args.generate == "multi-turn":
        return build_multi_turn(args)
    if args.generate == "benchmark":
        from miles_lite.text.benchmark import Benchmark

        top = args.benchmark_max_new_tokens or args.max_new_tokens
        if top is None:
            top = TextSamplingParams().max_new_tokens
        if args.benchmark_min_new_tokens is None:
            return Benchmark(max_new_tokens=top)
        return Benchmark(args.benchmark_min_new_tokens, top)
    return single_turn


def build_multi_turn(args: argparse.Namespace) -> GenerateFn:
    """``MultiTurn(MultiTurnOptions(...))`` from the ``--generate-*`` flags."""
    from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
    from miles_lite.text.tool_calls import TOOL_CALL_PARSERS

    name = args.generate_tool_call_parser
    if name is not None and name not in TOOL_CALL_PARSERS:
        raise ConfigError(
            f"--generate-tool-call-parser {name!r} is not one of {sorted(TOOL_CALL_PARSERS)}"
        )
    specs = None
    if args.generate_tool_specs_path:
        specs = load_object(args.generate_tool_specs_path)
        if callable(specs):
            specs = specs()  # a function returning the specs, as miles allows
    execute = None
    if args.generate_execute_tool_function_path:
        execute = load_function(args.generate_execute_tool_function_path)
    options = MultiTurnOptions(tool_specs=specs, execute_tool=execute)
    if name is not None:
        options = dataclasses.replace(options, parser=TOOL_CALL_PARSERS[name])
    return MultiTurn(apply_flags(options, given(args, MULTI_TURN_FIELDS)))


def _reward_kind(args: argparse.Namespace) -> str | None:
    """The reward kind the flags name: ``custom`` for a function by path, the
    ``--rm-type``, or None."""
    if args.reward_function_path:
        return "custom"
    return None if args.reward == "none" else str(args.reward)


def build_rewards(args: argparse.Namespace) -> dict[str, Any]:
    """The reward pool's function under the config's kind (:func:`_reward_kind`), if any."""
    kind = _reward_kind(args)
    if kind is None:
        return {}
    if kind == "custom":
        return {kind: load_function(args.reward_function_path)}
    return {}  # a built-in name: TextRollout.open finds it in rewards.BUILTIN_REWARDS


def build_filters(args: argparse.Namespace) -> list[GroupFilter]:
    """The dynamic filters, in order: built-in names, then a filter by dotted path."""
    filters: list[GroupFilter] = [_FILTERS[name] for name in args.dynamic_filter or ()]
    if args.dynamic_sampling_filter_path:
        filters.append(load_function(args.dynamic_sampling_filter_path))
    return filters


def load_prompts(path: str | os.PathLike[str], input_key: str, label_key: str) -> list[PromptGroup]:
    """One :class:`PromptGroup` per line of a JSONL file: the prompt (a string or a chat
    messages list) under ``input_key``, the label under ``label_key`` (optional), the
    rest as metadata. :class:`CliError` naming the file and line on anything else."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from exc
    prompts: list[PromptGroup] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CliError(
                f"{path} line {number} is not UTF-8 text (byte {raw[exc.start]:#04x} at"
                f" column {exc.start + 1}): a JSONL file is text"
            ) from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise CliError(f"{path} line {number} is not JSON: {exc}") from exc
        except RecursionError:
            raise CliError(
                f"{path} line {number} is nested too deeply to read (over about"
                f" {sys.getrecursionlimit()} levels)"
            ) from None
        if not isinstance(row, dict):
            raise CliError(f"{path} line {number} is a {type(row).__name__}, not a JSON object")
        if input_key not in row:
            raise CliError(
                f"{path} line {number} has no {input_key!r} key (--input-key); it has {sorted(row)}"
            )
        group = PromptGroup(prompt=row.pop(input_key), label=row.pop(label_key, None), metadata=row)
        try:
            check_prompts([group])
        except RecursionError:
            raise CliError(f"{path} line {number}: the prompt is nested too deeply") from None
        except ConfigError as exc:
            problem = str(exc).replace("run() prompt 0", "the prompt", 1)
            raise CliError(f"{path} line {number}: {problem}") from exc
        prompts.append(group)
    if not prompts:
        raise CliError(f"the prompt file {path} has no prompts")
    return prompts


def load_tokenizer(path: str) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; :class:`CliError` in one line if it fails
    (a local folder that does not exist fails at once, without asking a hub)."""
    if path.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(path)):
        raise CliError(f"cannot load the tokenizer from {path}: no such folder")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(path))
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot load the tokenizer from {path}: {first}") from exc


async def rollout(
    urls: Sequence[str],
    prompts: Sequence[Any],
    *,
    config: TextRolloutConfig,
    tokenizer: Any,
    generate: GenerateFn,
    options: Mapping[str, Any],
    rewards: Mapping[str, Any],
    filters: Sequence[GroupFilter],
    progress: bool,
) -> RolloutResult:
    """Open a text rollout on ``urls`` and run ``prompts`` once."""
    from miles_lite.text.rollout import TextRollout

    async with TextRollout.open(
        urls,
        tokenizer=tokenizer,
        config=config,
        rewards=rewards,
        generate=generate,
        generate_options=options,
        dynamic_filter=list(filters),
        progress=progress,
    ) as opened:
        return await opened.run(list(prompts))


def sample_record(sample: Sample) -> dict[str, Any]:
    """A sample as one JSON object (miles' field names)."""
    log_probs = sample.rollout_log_probs
    return {
        "index": sample.index,
        "group_index": sample.group_index,
        "prompt": sample.prompt,
        "label": sample.label,
        "response": sample.response,
        "tokens": list(sample.tokens),
        "response_length": sample.response_length,
        "loss_mask": list(sample.loss_mask or []),
        "rollout_log_probs": [float(v) for v in (log_probs if log_probs is not None else [])],
        "reward": sample.reward,
        "status": sample.status.value,
        "status_reason": sample.status_reason,
        "finish_reason": sample.finish_reason,
        "request_id": sample.request_id,
        "turns": sample.turns,
        "weight_versions": list(sample.weight_versions),
        "metadata": sample.metadata,
        "error": None if sample.error is None else str(sample.error),
    }


def write_samples(result: RolloutResult, path: str) -> int:
    """Write the kept samples as JSONL (``-``: stdout); the number written."""
    lines = [json.dumps(sample_record(s), default=str) for s in result.samples]
    if path == "-":
        sys.stdout.write("".join(line + "\n" for line in lines))
    else:
        Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def run(args: argparse.Namespace, *, generate: GenerateFn | None, options: dict[str, Any]) -> int:
    """``miles-lite text``: see the module docstring."""
    from miles_lite._core.run_sync import run_sync

    say_startup_steps()
    with one_line_errors():
        # Everything that needs no I/O first (then the files, the tokenizer, the engines).
        check_engine_urls(args.engine_url)
        config = build_config(args)
        check_outputs(output=args.output, trace=args.trace, timeline=args.timeline)
        generate_fn = build_generate(args, generate)
        rewards = build_rewards(args)
        filters = build_filters(args)
        prompts = load_prompts(args.prompt_data, args.input_key, args.label_key)
        with startup_step(f"loading the tokenizer from {args.tokenizer}"):
            tokenizer = load_tokenizer(args.tokenizer)
        job = functools.partial(
            rollout,
            list(args.engine_url),
            prompts,
            config=config,
            tokenizer=tokenizer,
            generate=generate_fn,
            options=options,
            rewards=rewards,
            filters=filters,
            progress=not args.no_progress,
        )
        result = run_sync(job, use_uvloop=args.uvloop)
        pictures = write_pictures(result, args.trace, args.timeline)
        if args.output:
            written = write_samples(result, args.output)
            if args.output != "-":
                pictures["samples"] = f"{args.output} ({written} samples)"
    report("text", result, as_json=args.json, pictures=pictures, tokenizer=tokenizer)
    return 1 if result.failed else 0
