"""Prompt groups: what a rollout's ``run()`` takes, turned into seeded samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miles_lite.errors import ConfigError
from miles_lite.rollout.seeds import group_seeds
from miles_lite.types import Sample

__all__ = ["PromptGroup", "make_groups", "renumbered"]


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


def make_groups(
    specs: Sequence[GroupSpec], *, n_samples: int, seed: int, rollout_id: int
) -> list[list[Sample]]:
    """``n_samples`` samples per prompt, numbered ``g * n_samples + j`` and seeded from
    (seed, rollout id, group); a carried-over group is renumbered for its place here.

    Raises :class:`ConfigError` when a prompt brings a seed list of another length.
    """
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
