"""Generate functions and their contract."""

from miles_lite.generate.contract import (
    GenerateFn,
    GenerateFnInput,
    GenerateFnOutput,
    load_function,
)
from miles_lite.generate.diffusion import (
    DiffusionState,
    apply_response_item,
    build_request,
    generate_diffusion,
)

__all__ = [
    "DiffusionState",
    "GenerateFn",
    "GenerateFnInput",
    "GenerateFnOutput",
    "apply_response_item",
    "build_request",
    "generate_diffusion",
    "load_function",
]
