"""The generate-function contract: ``async def generate(input) -> Sample | list[Sample]``.

As miles documents it: the input carries the sample(s) to fill, the request's sampling
parameters and the rollout's resources (here a typed ``context``: tokenizer and router
for text, the router and parser pool for diffusion), and the output is one
:class:`~miles_lite.types.Sample` or a list of them. ``run`` is what belongs to this
``run()`` only: its stop signal and requests in flight.

A generate function may also have:

- ``abort(run) -> AbortResult | None`` (async): called once on early stop, after the
  rollout aborted the run's requests at the engines (an agent's own work, say);
- ``bind(context)`` -> an async context manager: entered when the rollout opens with
  it, for resources it keeps across runs (the agentic session server).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from miles_lite.rollout.context import RunContext
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample

__all__ = ["AbortResult", "BindsContext", "GenerateFn", "GenerateFnInput"]

C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)


@dataclass
class GenerateFnInput(Generic[C]):
    """What a generate function gets.

    - ``samples``: the samples to fill (one for text, a microgroup for diffusion);
      ``sample`` is the first (for text, the only one);
    - ``sampling_params``: the request's sampling fields (a fresh dict per call: the
      function may change it);
    - ``context``: the rollout's resources, typed by the kind
      (:class:`~miles_lite.text.TextContext`, :class:`~miles_lite.diffusion.DiffusionContext`);
    - ``run``: this run's stop signal and requests in flight; a function checks
      ``run.stopping`` before sending anything new;
    - ``span``: the unit's stage record; the function fills ``generate_start`` /
      ``generate_end`` (and ``deserialize_*``, ``engine``, ``requests``, ``wire_bytes``,
      ``non_generation_time_s`` where it knows them);
    - ``options``: for custom functions loaded by the CLI, the values of the flags the
      function registered with its ``add_arguments(parser)`` attribute (miles' contract);
      the library's own functions take typed options objects instead.
    """

    samples: list[Sample]
    sampling_params: dict[str, Any]
    context: C
    run: RunContext
    span: UnitSpan = field(default_factory=lambda: UnitSpan(group_index=0, unit_index=0, size=1))
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sample(self) -> Sample:
        """The first (for text rollouts, the only) sample."""
        return self.samples[0]

    @property
    def state(self) -> C:
        """``context`` under miles' name."""
        return self.context


GenerateFn = Callable[[GenerateFnInput[Any]], Awaitable[Sample | list[Sample]]]


@dataclass(frozen=True, slots=True)
class AbortResult:
    """How a generate function's ``abort`` hook went: ``called`` (it had work to stop),
    ``error`` (what it raised, or a timeout), ``elapsed_s``. Reported in the rollout's
    metrics (``rollout/abort_hook_errors``, ``perf/abort_hook_time``), never raised."""

    called: bool
    error: Exception | None = None
    elapsed_s: float = 0.0


@runtime_checkable
class BindsContext(Protocol[C_contra]):
    """A generate function holding resources across runs (see the module docstring)."""

    def bind(self, context: C_contra) -> AbstractAsyncContextManager[None]:
        """An async context manager the rollout enters when it opens with the function."""
        ...
