"""The generate-function contract: ``async def generate(input) -> Sample | list[Sample]``."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from miles_lite.errors import ConfigError
from miles_lite.types import Sample

__all__ = ["GenerateFn", "GenerateFnInput", "GenerateFnOutput", "load_function"]

GenerateFnOutput = Sample | list[Sample]


@dataclass
class GenerateFnInput:
    """What a generate function gets.

    ``samples``: the samples to fill (one for text generation, a microgroup for
    diffusion; ``sample`` is the first); ``sampling_params``: request fields;
    ``state``: the rollout's resources (engine client, router, pools, config), typed by
    the rollout kind; ``spans``: a dict the function may fill with stage times
    (``time.monotonic()``): ``generate_start``/``generate_end``/``deserialize_start``/
    ``deserialize_end``, and ``wire_bytes``.
    """

    samples: list[Sample]
    sampling_params: dict[str, Any]
    state: Any
    spans: dict[str, Any] = field(default_factory=dict)

    @property
    def sample(self) -> Sample:
        """The first (for text rollouts, the only) sample."""
        return self.samples[0]


GenerateFn = Callable[[GenerateFnInput], Awaitable[GenerateFnOutput]]


def load_function(path: str) -> Callable[..., Any]:
    """Import ``package.module.function`` (the CLI's ``--custom-*-path`` flags).

    Raises :class:`ConfigError` naming the path when it does not resolve to a callable.
    """
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"function path {path!r} must be 'module.function'")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load function {path!r}: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"{path!r} is not callable")
    return fn  # type: ignore[no-any-return]
