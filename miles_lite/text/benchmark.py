"""``Benchmark``: single-turn generation with random output lengths, for load tests.

Each sample asks for a length drawn uniformly from ``[min_new_tokens, max_new_tokens]``
(seeded by the sample's seed) with ``ignore_eos``, so the engine generates exactly that
many tokens (miles' ``generate_with_random_osl``).
"""

from __future__ import annotations

import random

from miles_lite._core.validate import check_int
from miles_lite.errors import ConfigError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.text.context import TextContext
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.types import Sample

__all__ = ["Benchmark"]


class Benchmark:
    """A generate function: one sample of a random length (see the module docstring).

    Raises ``ConfigError`` unless ``0 < min_new_tokens <= max_new_tokens``.

    Usage: ``TextRollout.open(urls, ..., generate=Benchmark(1, 1024))``.
    """

    def __init__(self, min_new_tokens: int = 1, max_new_tokens: int = 1024) -> None:
        check_int("Benchmark", "min_new_tokens", min_new_tokens)
        check_int("Benchmark", "max_new_tokens", max_new_tokens)
        if min_new_tokens > max_new_tokens:
            raise ConfigError(
                f"Benchmark lengths need min_new_tokens <= max_new_tokens, got"
                f" {min_new_tokens} > {max_new_tokens}"
            )
        self.min_new_tokens = min_new_tokens
        self.max_new_tokens = max_new_tokens

    async def __call__(self, input: GenerateFnInput[TextContext]) -> Sample:
        """Generate one sample of a random length."""
        length = random.Random(input.sample.seed).randint(self.min_new_tokens, self.max_new_tokens)
        input.sampling_params.update(max_new_tokens=length, ignore_eos=True)
        return await single_turn(input)
