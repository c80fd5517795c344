"""``benchmark``: single-turn generation with random output lengths, for load tests.

Each sample asks for a length drawn uniformly from ``[benchmark_min_new_tokens,
benchmark_max_new_tokens]`` (seeded by the sample's seed) with ``ignore_eos``, so the
engine generates exactly that many tokens (miles' ``generate_with_random_osl``).
"""

from __future__ import annotations

import argparse
import random

from miles_lite.errors import ConfigError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.text import single_turn
from miles_lite.types import Sample

__all__ = ["add_arguments", "generate"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--benchmark-min-new-tokens`` and ``--benchmark-max-new-tokens``."""
    group = parser.add_argument_group("benchmark generation")
    group.add_argument("--benchmark-min-new-tokens", type=int, default=1)
    group.add_argument("--benchmark-max-new-tokens", type=int, default=1024)


async def generate(input: GenerateFnInput) -> Sample:
    """Generate one sample of a random length (see the module docstring)."""
    low = int(input.options.get("benchmark_min_new_tokens", 1))
    high = int(input.options.get("benchmark_max_new_tokens", 1024))
    if not 0 < low <= high:
        raise ConfigError(f"benchmark lengths need 0 < min <= max, got min={low} max={high}")
    length = random.Random(input.sample.seed).randint(low, high)
    input.sampling_params.update(max_new_tokens=length, ignore_eos=True)
    return await single_turn.generate(input)


generate.add_arguments = add_arguments  # type: ignore[attr-defined]
