"""What a diffusion generate function gets as ``input.context``: the rollout's resources."""

from __future__ import annotations

from dataclasses import dataclass

from miles_lite.diffusion.config import TransportMode
from miles_lite.engine.router import Router
from miles_lite.errors import ConfigError
from miles_lite.pools.arena import Arena
from miles_lite.pools.parser_pool import ParserPool

__all__ = ["DiffusionContext"]


@dataclass(frozen=True)
class DiffusionContext:
    """The resources of a diffusion rollout, shared by its generate calls.

    ``router`` leases engines (its ``client`` posts); ``mode`` says how a body becomes
    tensors (resolved once, when the rollout is made); ``parser`` decodes off the loop
    (``POOL`` and ``FETCH``); ``arena`` is where bodies the main process reads land (the
    parser pool's, or one of the rollout's own for ``INLINE``; ``None``: fresh memory).
    """

    router: Router
    mode: TransportMode
    parser: ParserPool | None = None
    arena: Arena | None = None

    def __post_init__(self) -> None:
        if self.mode is not TransportMode.INLINE and self.parser is None:
            raise ConfigError(
                f"transport {self.mode.value!r} needs a parser pool (transport='pool' or"
                " fetch_in_parser): pass parser=ParserPool(...) or use DiffusionRollout.open"
            )
