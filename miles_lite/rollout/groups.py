"""Prompt groups: what a rollout's ``run()`` takes, turned into seeded samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miles_lite.errors import ConfigError
from miles_lite.rollout.seeds import group_seeds
from miles_lite.types import Sample

__all__ = ["PromptGroup", "check_prompts", "make_groups", "renumbered"]


@dataclass
class PromptGroup:
    """A prompt (text, or chat ``messages``) and, optionally, its own seed list (one per
    sample), label and metadata."""

    prompt: str | list[dict[str, Any]]
    seeds: list[int] | None = None
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


#: What ``run()`` takes per group: a prompt, a :class:`PromptGroup`, or a group of samples
#: carried over from an earlier rollout (its ``partial`` groups).
GroupSpec = str | list[dict[str, Any]] | PromptGroup | list[Sample]


def check_prompts(specs: object, *, chat: bool = True) -> None:
    """Refuse what ``run()`` cannot take, before anything is sent: :class:`ConfigError`
    naming the index and what was expected.

    ``specs`` must be a list (or tuple) of prompts: a ``str`` (``run("a cat")`` would
    otherwise run five one-letter prompts), a chat ``messages`` list of ``{"role": ...,
    "content": ...}`` dicts (when ``chat``: text rollouts), a :class:`PromptGroup`
    holding one of those, or a group of samples from an earlier ``result.partial``.
    """
    if isinstance(specs, str | bytes) or not isinstance(specs, list | tuple):
        example = f"[{specs!r:.40}]" if isinstance(specs, str) else "['a cat', ...]"
        raise ConfigError(
            f"run() takes a list of prompts, got {type(specs).__name__} {specs!r:.60}:"
            f" pass e.g. run({example})"
        )
    expected = (
        "a str, a chat messages list of {'role': ..., 'content': ...} dicts, a PromptGroup"
        " or a group of samples from result.partial"
        if chat
        else "a str, a PromptGroup or a group of samples from result.partial"
    )
    for index, spec in enumerate(specs):
        if isinstance(spec, list) and spec and all(isinstance(s, Sample) for s in spec):
            continue
        prompt = spec.prompt if isinstance(spec, PromptGroup) else spec
        problem = _prompt_problem(prompt, chat)
        if problem is not None:
            raise ConfigError(f"run() prompt {index} {problem}: expected {expected}")


def _prompt_problem(prompt: object, chat: bool) -> str | None:
    """What is wrong with one prompt, or None."""
    if isinstance(prompt, str):
        return None
    if not isinstance(prompt, list):
        return f"is {type(prompt).__name__} {prompt!r:.60}"
    if not chat:
        return "is a list (a chat messages list?); this rollout takes text prompts"
    if not prompt:
        return "is an empty list"
    for m, message in enumerate(prompt):
        if isinstance(message, Sample):
            return "mixes samples with other values"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return (
                f"message {m} is {type(message).__name__} {message!r:.60}, not a dict with a 'role'"
            )
    return None


def make_groups(
    specs: Sequence[GroupSpec],
    *,
    n_samples: int,
    seed: int,
    rollout_id: int,
    chat: bool = True,
) -> list[list[Sample]]:
    """``n_samples`` samples per prompt, numbered ``g * n_samples + j`` and seeded from
    (seed, rollout id, group); a carried-over group is renumbered for its place here.

    Raises :class:`ConfigError` when a prompt is not one ``run()`` takes
    (:func:`check_prompts`; ``chat``: chat messages lists are allowed) or brings a seed
    list of another length.
    """
    check_prompts(specs, chat=chat)
    groups: list[list[Sample]] = []
    for g, spec in enumerate(specs):
        if isinstance(spec, list) and spec and all(isinstance(s, Sample) for s in spec):
            groups.append(renumbered(spec, g, n_samples))  # type: ignore[arg-type]
            continue
        group = spec if isinstance(spec, PromptGroup) else PromptGroup(prompt=spec)  # type: ignore[arg-type]
        seeds = group.seeds or group_seeds(seed, rollout_id, g, n_samples)
        if len(seeds) != n_samples:
            raise ConfigError(
                f"prompt {g} has {len(seeds)} seeds for {n_samples} samples per prompt"
            )
        groups.append(
            [
                Sample(
                    index=g * n_samples + j,
                    group_index=g,
                    prompt=group.prompt,
                    label=group.label,
                    seed=seeds[j],
                    metadata=dict(group.metadata),
                )
                for j in range(n_samples)
            ]
        )
    return groups


def renumbered(group: list[Sample], group_index: int, n_samples: int) -> list[Sample]:
    """A group carried over from an earlier rollout, numbered for its place in this one:
    sample ``j`` of group ``g`` gets index ``g * n_samples + j`` (its seed is kept)."""
    for j, sample in enumerate(group):
        sample.group_index = group_index
        sample.index = group_index * n_samples + j
    return group
