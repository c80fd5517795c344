"""Which flag sets which config field: the flags a user gave, and only those, replace the
fields of a config class's default instance, so the class owns every default (the
command line owns none, see :data:`miles_lite.cli._args.CONFIG_DEFAULTS`).

A value the class refuses is a :class:`~miles_lite.cli.paths.CliError` naming the flag,
its value and the class's reason (``--temperature nan: TextSamplingParams.temperature
must be a finite number >= 0, got nan``), raised before any I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from miles_lite.cli.paths import CliError
from miles_lite.errors import ConfigError

__all__ = [
    "DIFFUSION_FIELDS",
    "MULTI_TURN_FIELDS",
    "SESSION_FIELDS",
    "TEXT_FIELDS",
    "FlagField",
    "Given",
    "apply_flags",
    "given",
]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class FlagField:
    """The config field a flag sets: ``flag`` (as the user types it), ``path`` (dotted,
    from the rollout config: ``engines.router.ready_timeout_s``) and ``convert`` (the
    flag's unit to the field's, e.g. MiB to bytes)."""

    flag: str
    path: str
    convert: Callable[[Any], object] | None = None


def _fields(*rows: tuple[str, str, str]) -> dict[str, FlagField]:
    return {dest: FlagField(flag=flag, path=path) for dest, flag, path in rows}


_ROLLOUT = (
    ("samples_per_prompt", "--n-samples-per-prompt", "n_samples_per_prompt"),
    ("seed", "--seed", "seed"),
    ("reward_workers", "--reward-workers", "reward_workers"),
    ("rollout_batch_size", "--rollout-batch-size", "rollout_batch_size"),
    ("over_sampling_batch_size", "--over-sampling-batch-size", "over_sampling_batch_size"),
    ("max_inflight_per_engine", "--max-inflight-per-engine",
     "engines.router.max_inflight_per_engine"),
    ("wait_for_engines", "--wait-for-engines", "engines.router.ready_timeout_s"),
)  # fmt: skip

#: ``miles-lite text``: flag destination -> the :class:`TextRolloutConfig` field it sets.
TEXT_FIELDS: dict[str, FlagField] = _fields(
    *_ROLLOUT,
    ("max_new_tokens", "--max-new-tokens", "sampling.max_new_tokens"),
    ("temperature", "--temperature", "sampling.temperature"),
    ("top_p", "--top-p", "sampling.top_p"),
    ("max_context_len", "--max-context-len", "max_context_len"),
)

#: ``miles-lite text --generate multi-turn``: flag destination -> the
#: :class:`~miles_lite.text.multi_turn.MultiTurnOptions` field it sets (``--generate-tool-
#: call-parser`` names a parser, looked up by the command).
MULTI_TURN_FIELDS: dict[str, FlagField] = _fields(
    ("generate_max_turns", "--generate-max-turns", "max_turns"),
    ("generate_tool_timeout_s", "--generate-tool-timeout-s", "tool_timeout_s"),
)

#: ``miles-lite text --custom-agent-function-path``: flag destination -> the
#: :class:`~miles_lite.agentic.config.SessionServerConfig` field it sets.
SESSION_FIELDS: dict[str, FlagField] = _fields(
    ("session_processes", "--session-processes", "processes"),
)

#: ``miles-lite diffusion`` (and the demo's diffusion half): flag destination -> the
#: :class:`DiffusionRolloutConfig` field it sets.
DIFFUSION_FIELDS: dict[str, FlagField] = {
    **_fields(
        *_ROLLOUT,
        ("microgroup_size", "--microgroup-size", "microgroup_size"),
        ("steps", "--steps", "sampling.num_inference_steps"),
        ("width", "--width", "sampling.width"),
        ("height", "--height", "sampling.height"),
        ("num_frames", "--num-frames", "sampling.num_frames"),
        ("transport", "--transport", "transport"),
        ("parser_workers", "--parser-workers", "parser.workers"),
    ),
    "fetch_in_parser": FlagField(
        flag="--fetch-in-parser", path="fetch_in_parser", convert=lambda on: on or None
    ),
    "arena_mb": FlagField(
        flag="--arena-mb", path="parser.arena.size_bytes", convert=lambda mb: mb << 20
    ),
}


#: A flag the user gave: its field, the value as given, the value in the field's unit.
Given = tuple[FlagField, Any, Any]


def given(args: argparse.Namespace, table: Mapping[str, FlagField]) -> list[Given]:
    """The flags of ``table`` the user gave (not ``None``, after ``convert``), in the
    table's order. Flags a command does not have count as not given (the demo has no
    ``--width``)."""
    values = vars(args)
    found = []
    for dest, field in table.items():
        raw = values.get(dest)
        value = raw if raw is None or field.convert is None else field.convert(raw)
        if value is not None:
            found.append((field, raw, value))
    return found


def apply_flags(default: T, flags: list[Given]) -> T:
    """``default`` (a frozen config) with each flag's value at its field, set in order, so
    every nested config checks it as it is replaced. :class:`CliError` naming the first
    flag whose value a class refuses (one that conflicts with an earlier flag included)."""
    config = default
    for field, raw, value in flags:
        config = _set(config, field, raw, value)
    return config


def _set(config: T, field: FlagField, raw: object, value: object) -> T:
    try:
        return _replace(config, field.path.split("."), value)
    except ConfigError as exc:
        raise CliError(f"{field.flag} {raw}: {exc}") from exc


def _replace(obj: T, names: list[str], value: object) -> T:
    head, *rest = names
    new = _replace(getattr(obj, head), rest, value) if rest else value
    return dataclasses.replace(obj, **{head: new})  # type: ignore[type-var]
