"""A custom generate function with its own CLI flag, loaded by dotted path in CLI tests."""

from __future__ import annotations

import argparse
import sys

from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.types import Sample


async def tagging_generate(input: GenerateFnInput) -> list[Sample]:
    """The default diffusion generate, tagging samples with the value of ``--tag``."""
    samples = await generate_diffusion(input)
    print(f"tag={input.options['tag']}", file=sys.stderr)
    for sample in samples:
        sample.metadata["tag"] = input.options["tag"]
    return samples


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tag", required=True)


tagging_generate.add_arguments = _add_arguments  # type: ignore[attr-defined]
