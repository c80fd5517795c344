"""The default diffusion generate function: one microgroup, one ``/rollout/generate`` request.

generate (POST, raw body bytes into arena memory) -> deserialize (parser pool, or inline)
-> fill the samples. With ``fetch_in_parser`` both steps run in one parser-worker call and
the body never enters the main process.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from miles_lite.codecs.body import wire_form
from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.engine.blocking import BlockingRequest
from miles_lite.engine.client import EngineClient
from miles_lite.engine.response import BodyBuffer, RawResponse, allocate_fresh
from miles_lite.engine.router import Router
from miles_lite.errors import ArenaFullError, CodecError, EngineProtocolError
from miles_lite.pools.arena import Arena, Lease
from miles_lite.pools.parser_pool import ParserPool
from miles_lite.rollout.config import DiffusionRolloutConfig
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import DiTTrajectory, Sample, SampleStatus

__all__ = ["DiffusionState", "apply_response_item", "build_request", "generate_diffusion"]

PATH = "/rollout/generate"


@dataclass
class DiffusionState:
    """The resources a diffusion generate function uses (``GenerateFnInput.state``)."""

    config: DiffusionRolloutConfig
    client: EngineClient
    router: Router
    parser: ParserPool | None
    #: Where bodies read by the main process land: the parser pool's arena, or (inline
    #: transport) one of the rollout's own; None: fresh memory per body.
    arena: Arena | None = None


def build_request(samples: list[Sample], sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The ``/rollout/generate`` body of a microgroup: its first sample's seed, its size."""
    first = samples[0]
    if first.seed is None:
        # A null seed makes SGLang fail with a 500 after generating (WIRE.md section 4).
        raise ValueError(f"sample {first.index} has no seed")
    return {
        **sampling_params,
        "prompt": first.prompt,
        "seed": first.seed,
        "num_outputs_per_prompt": len(samples),
    }


async def generate_diffusion(input: GenerateFnInput) -> list[Sample]:
    """Generate and decode one microgroup; fill ``input.samples`` and return them.

    Records ``generate_*``/``deserialize_*`` times, ``engine``, ``wire_bytes`` and
    ``spilled`` (the arena was full: the body went through private memory) in
    ``input.span``. Raises engine, codec and worker errors (typed, with engine URL and
    request id); the caller marks the samples failed.
    """
    state: DiffusionState = input.state
    cfg = state.config
    samples = input.samples
    payload = build_request(samples, input.sampling_params)
    rid = uuid.uuid4().hex
    span = input.span
    span.generate_start = time.monotonic()

    if cfg.fetch_in_parser:
        parser = _need_parser(state)
        # The engine client's config owns every per-request limit, in both transports.
        limits = state.client.config

        async def fetch_from(url: str) -> Any:
            span.engine = url
            span.requests += 1
            request = BlockingRequest.from_config(limits, url, PATH, payload, request_id=rid)
            return await parser.fetch(request, expected_items=len(samples))

        # A retry (never of a request the engine received) asks the router for another engine.
        parsed = await state.router.call(fetch_from)
        span.spilled = parsed.spilled
        span.pickled_bytes = parsed.pickled_bytes
        span.generate_end = parsed.read_at
        span.deserialize_start = parsed.read_at
        items = parsed.items
        span.wire_bytes = parsed.wire_bytes
    else:
        arena = state.arena

        async def into(nbytes: int) -> BodyBuffer:
            if arena is None:
                return await allocate_fresh(nbytes)
            try:
                return await arena.lease(nbytes)
            except ArenaFullError:
                # Everything in the arena is held: spill this body rather than fail.
                span.spilled = True
                return await allocate_fresh(nbytes)

        async def post_to(url: str) -> RawResponse:
            span.engine = url
            span.requests += 1
            return await state.client.post(
                url, PATH, payload, request_id=rid, into=into, retry=False
            )

        raw = await state.router.call(post_to)
        span.generate_end = span.deserialize_start = time.monotonic()
        span.wire_bytes = len(raw.body)
        items = await _deserialize(state, raw, rid, span)
    span.deserialize_end = time.monotonic()

    if len(items) != len(samples):
        raise EngineProtocolError(
            f"engine returned {len(items)} samples for num_outputs_per_prompt={len(samples)}",
            url=span.engine,
            request_id=rid,
        )
    for i, (sample, item) in enumerate(zip(samples, items, strict=True)):
        apply_response_item(sample, item, seed=payload["seed"] + i)
    return samples


async def _deserialize(
    state: DiffusionState, raw: RawResponse, rid: str, span: UnitSpan
) -> list[Any]:
    owner = raw.owner
    if state.config.transport == "pool" and (
        isinstance(owner, Lease) or wire_form(raw.content_type) == "json"
    ):
        # In place in the arena; a spilled JSON body goes to the worker through the pipe.
        parser = _need_parser(state)
        body = owner if isinstance(owner, Lease) else bytes(raw.body)
        parsed = await parser.parse(body, raw.content_type, url=raw.url, request_id=rid)
        span.pickled_bytes = parsed.pickled_bytes
        return parsed.items
    # Inline (and spilled msgpack bodies): zero-copy for msgpack, microseconds on the
    # loop; base64/JSON here is the slow baseline the transport benchmark measures. The
    # tensors view raw.body, which keeps its buffer (an arena lease) alive.
    try:
        return decode_to_tensors(raw.body, raw.content_type)
    except CodecError as exc:
        exc.with_context(url=raw.url, request_id=rid)
        raise


def _need_parser(state: DiffusionState) -> ParserPool:
    if state.parser is None:
        raise ValueError("this rollout needs a parser pool (transport='pool' or fetch_in_parser)")
    return state.parser


def apply_response_item(sample: Sample, item: Any, *, seed: int) -> None:
    """Fill ``sample`` from one decoded per-sample map of a ``/rollout/generate`` answer.

    ``seed`` is the sample's own seed (request seed + its position): the engine echoes the
    request's seed unchanged for every sample. Raises CodecError on a non-map item.
    """
    if not isinstance(item, dict):
        raise CodecError(f"sample map expected, got {type(item).__name__}")
    sample.seed = seed
    sample.request_id = item.get("request_id")
    sample.generated_output = item.get("generated_output")
    sample.rollout_log_probs = item.get("rollout_log_probs")
    sample.rollout_debug_tensors = item.get("rollout_debug_tensors")
    sample.denoising_env = item.get("denoising_env")
    trajectory = item.get("dit_trajectory")
    sample.dit_trajectory = (
        DiTTrajectory(
            latents=trajectory.get("latents"),
            timesteps=trajectory.get("timesteps"),
            sigmas=trajectory.get("sigmas"),
        )
        if isinstance(trajectory, dict)
        else None
    )
    sample.inference_time_s = item.get("inference_time_s")
    sample.peak_memory_mb = item.get("peak_memory_mb")
    sample.status = SampleStatus.COMPLETED
