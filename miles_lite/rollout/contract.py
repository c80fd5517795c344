"""The generate-function contract: ``async def generate(input) -> Sample | list[Sample]``.

As miles documents it: the input carries the sample(s) to fill, the request's sampling
parameters and the rollout's ``state`` (tokenizer, engine router, settings), and the
output is one :class:`~miles_lite.types.Sample` or a list of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from miles_lite.errors import ConfigError
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample

__all__ = ["GenerateFn", "GenerateFnInput", "GenerateFnOutput", "load_function", "load_object"]

GenerateFnOutput = Sample | list[Sample]


@dataclass
class GenerateFnInput:
    """What a generate function gets.

    - ``samples``: the samples to fill (one for text, a microgroup for diffusion);
      ``sample`` is the first (for text, the only one);
    - ``sampling_params``: the request's sampling fields (a fresh dict per call: the
      function may change it);
    - ``state``: the rollout's resources, typed by the rollout kind
      (:class:`~miles_lite.diffusion.generate.DiffusionState`, ``TextState``);
    - ``span``: the unit's stage record; the function fills ``generate_start`` /
      ``generate_end`` (and ``deserialize_*``, ``engine``, ``requests``, ``wire_bytes``,
      ``non_generation_time_s`` where it knows them);
    - ``options``: values of the flags the function registered with its
      ``add_arguments(parser)`` attribute (CLI), or given by a library user
      (``generate_options=`` of the rollout), by flag destination name.
    """

    samples: list[Sample]
    sampling_params: dict[str, Any]
    state: Any
    span: UnitSpan = field(default_factory=lambda: UnitSpan(group_index=0, unit_index=0, size=1))
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sample(self) -> Sample:
        """The first (for text rollouts, the only) sample."""
        return self.samples[0]


GenerateFn = Callable[[GenerateFnInput], Awaitable[GenerateFnOutput]]


def load_object(path: str) -> Any:
    """Import ``package.module.name`` (a function, or data such as a list of tool specs).

    Raises :class:`ConfigError` naming the path when it does not resolve.
    """
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"path {path!r} must be 'module.name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {path!r}: {exc}") from exc


def load_function(path: str) -> Callable[..., Any]:
    """Import ``package.module.function`` (the CLI's ``--custom-*-path`` flags).

    Raises :class:`ConfigError` naming the path when it does not resolve to a callable.
    """
    fn = load_object(path)
    if not callable(fn):
        raise ConfigError(f"{path!r} is not callable")
    return fn  # type: ignore[no-any-return]
