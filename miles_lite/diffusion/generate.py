"""The default diffusion generate function: one microgroup, one ``/rollout/generate`` request.

generate (POST, raw body bytes into arena memory) -> deserialize (parser pool, or inline)
-> fill the samples. With ``fetch_in_parser`` both steps run in one parser-worker call and
the body never enters the main process.
"""

from __future__ import annotations

import time
from typing import Any

from miles_lite.codecs.body import wire_form
from miles_lite.codecs.tensors import decode_to_tensors
from miles_lite.diffusion.config import TransportMode
from miles_lite.diffusion.context import DiffusionContext
from miles_lite.engine.http.blocking import BlockingRequest
from miles_lite.engine.http.response import BodyBuffer, RawResponse, allocate_fresh
from miles_lite.errors import ArenaFullError, CodecError, ConfigError, EngineProtocolError
from miles_lite.pools.arena import Lease
from miles_lite.pools.parser_pool import ParsedBody, ParserPool
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.diffusion_wire import ROLLOUT_PATH, apply_response_item, build_request
from miles_lite.sglang.generate_wire import new_rid
from miles_lite.types import Sample

__all__ = ["generate_diffusion"]


async def generate_diffusion(input: GenerateFnInput[DiffusionContext]) -> list[Sample]:
    """Generate and decode one microgroup; fill ``input.samples`` and return them.

    Records ``generate_*``/``deserialize_*`` times, ``engine``, ``wire_bytes``,
    ``spilled`` (the arena was full: the body went through private memory) and
    ``pickled_bytes`` in ``input.span``. Raises engine, codec and worker errors (typed,
    with engine URL and request id); the caller marks the samples failed. A request the
    engine received is never sent again (the router's one retry loop).
    """
    ctx = input.context
    samples = input.samples
    payload = build_request(samples, input.sampling_params)
    rid = new_rid()
    span = input.span
    span.generate_start = time.monotonic()
    router = ctx.router

    if ctx.mode is TransportMode.FETCH:
        parser = _parser(ctx)
        # The engine client's config owns every per-request limit, in both transports.
        limits = router.client.config

        async def fetch_from(url: str) -> ParsedBody:
            span.engine = url
            span.requests += 1
            span.leased()
            request = BlockingRequest.from_config(
                limits, url, ROLLOUT_PATH, payload, request_id=rid
            )
            return await parser.fetch(request, expected_items=len(samples))

        parsed = await router.call(fetch_from)
        span.parser_worker = parsed.worker
        span.fetched_in_parser = True
        span.spilled = parsed.spilled
        span.pickled_bytes = parsed.pickled_bytes
        span.generate_end = parsed.read_at
        span.deserialize_start = parsed.read_at
        items = parsed.items
        span.wire_bytes = parsed.wire_bytes
    else:
        arena = ctx.arena

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
            span.leased()
            return await router.client.post(
                url, ROLLOUT_PATH, payload, request_id=rid, into=into, retry=False
            )

        raw = await router.call(post_to)
        span.generate_end = span.deserialize_start = time.monotonic()
        span.wire_bytes = len(raw.body)
        items = await _deserialize(ctx, raw, rid, span)
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
    ctx: DiffusionContext, raw: RawResponse, rid: str, span: UnitSpan
) -> list[Any]:
    owner = raw.owner
    if ctx.mode is TransportMode.POOL and (
        isinstance(owner, Lease) or wire_form(raw.content_type) == "json"
    ):
        # In place in the arena; a spilled JSON body goes to the worker through the pipe.
        body = owner if isinstance(owner, Lease) else bytes(raw.body)
        parsed = await _parser(ctx).parse(body, raw.content_type, url=raw.url, request_id=rid)
        span.parser_worker = parsed.worker
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


def _parser(ctx: DiffusionContext) -> ParserPool:
    if ctx.parser is None:  # DiffusionContext refuses POOL and FETCH without one
        raise ConfigError(f"transport {ctx.mode.value!r} needs a parser pool")
    return ctx.parser
