"""Whole ``/rollout/generate`` answer bodies of synthetic samples, in either wire form.

A body is built one sample at a time and kept as a list of pieces whose concatenation is
exactly ``encode_msgpack_body(samples)`` (or ``encode_json_body``): peak memory stays at
the body plus one sample's tensors, and the server writes the pieces without joining them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgpack

from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.encode import (
    encode_json_body,
    encode_msgpack_body,
    encode_msgpack_pieces,
)
from miles_lite.testing.diffusion.request import RolloutRequest
from miles_lite.testing.diffusion.trajectories import build_sample

__all__ = ["body_pieces", "empty_body", "synthetic_body"]


def body_pieces(
    request: RolloutRequest,
    config: StandInConfig,
    *,
    between_samples: Callable[[], None] | None = None,
) -> list[memoryview]:
    """The answer body to ``request`` as pieces to send in order (``request.seed`` set).

    ``between_samples`` is called before each sample is built; the engine passes
    ``anyio.from_thread.check_cancelled`` so an aborted request stops building early (the
    exception it raises propagates). Raises ValueError when ``request.seed`` is None.
    """
    n = request.num_outputs_per_prompt
    pieces: list[memoryview] = []
    if config.wire == "msgpack":
        pieces.append(memoryview(msgpack.Packer().pack_array_header(n)))
    else:
        pieces.append(memoryview(b"["))
    for index in range(n):
        if between_samples is not None:
            between_samples()
        sample = build_sample(request, index=index, config=config)
        if config.wire == "msgpack":
            # Pieces view the tensors: no copy, the body goes out at memory speed.
            pieces.extend(memoryview(piece) for piece in encode_msgpack_pieces(sample))
        else:
            if index:
                pieces.append(memoryview(b", "))  # json.dumps' default item separator
            pieces.append(memoryview(encode_json_body([sample]))[1:-1])
        del sample
    if config.wire == "json":
        pieces.append(memoryview(b"]"))
    return pieces


def synthetic_body(request: dict[str, Any], config: StandInConfig) -> bytes:
    """The complete answer body to a ``/rollout/generate`` JSON request, as one bytes.

    What the engine would send (``request`` must carry an integer ``seed``). Raises
    :class:`~miles_lite.testing.InvalidRequestError` for a refused request and ValueError
    for a missing seed.
    """
    parsed = RolloutRequest.parse(request, config)
    if parsed.rid is None:
        parsed = dataclasses.replace(parsed, rid="")
    return b"".join(body_pieces(parsed, config))


def empty_body(config: StandInConfig) -> bytes:
    """An empty sample list in the config's wire form: the answer of an aborted request."""
    return encode_msgpack_body([]) if config.wire == "msgpack" else encode_json_body([])
