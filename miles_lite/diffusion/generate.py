"""The default diffusion generate function: one microgroup, one ``/rollout/generate`` request.

generate (POST, raw body bytes into arena memory) -> deserialize (parser pool, or inline)
-> fill the samples. With ``fetch_in_parser`` both steps run in one parser-worker call and
the body never enters the main process.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
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
from miles_lite.rollout.send import RawSend, Send
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.diffusion_wire import ROLLOUT_PATH, apply_response_item, build_request
from miles_lite.sglang.generate_wire import new_rid
from miles_lite.types import Sample, SampleStatus

__all__ = ["generate_diffusion"]


async def generate_diffusion(input: GenerateFnInput[DiffusionContext]) -> list[Sample]:
    """Generate and decode one microgroup; fill ``input.samples`` and return them.

    Records ``generate_*``/``deserialize_*`` times, ``engine``, ``wire_bytes``,
    ``spilled`` (the arena was full: the body went through private memory) and
    ``pickled_bytes`` in ``input.span``. Raises engine, codec and worker errors (typed,
    with engine URL and request id); the caller marks the samples failed. A request the
    engine received is never sent again (the one send path,
    :class:`~miles_lite.rollout.send.Send`); a microgroup still waiting for an engine
    slot when the run stops is never sent: its samples come back ABORTED (early stop).
    """
    ctx = input.context
    samples = input.samples
    payload = build_request(samples, input.sampling_params)
    rid = new_rid()
    span = input.span
    span.generate_start = time.monotonic()
    router = ctx.router

    if ctx.mode is TransportMode.FETCH:
        fetch = _Fetch(router, input.run, ROLLOUT_PATH, payload, rid, span)
        fetch.parser = _parser(ctx)
        fetch.expected_items = len(samples)
        parsed = await fetch.run()
        if parsed is None:
            return _stopped(samples)
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

        raw = await _Post(router, input.run, ROLLOUT_PATH, payload, rid, span, into=into).run()
        if raw is None:
            return _stopped(samples)
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


class _Post(RawSend):
    """The microgroup's request, its body into arena memory. Diffusion engines take no
    cache key and cannot abort a request (the driver cancels it on early stop)."""

    __slots__ = ()
    keyed = False
    abortable = False


class _Fetch(Send[ParsedBody, ParsedBody]):
    """The microgroup's request posted and parsed by a parser worker (``fetch_in_parser``):
    the body never enters the main process."""

    __slots__ = ("expected_items", "parser")
    parser: ParserPool
    expected_items: int
    keyed = False
    abortable = False

    def request(self, url: str) -> Awaitable[ParsedBody]:
        # The engine client's config owns every per-request limit, in both transports.
        limits = self.router.client.config
        request = BlockingRequest.from_config(
            limits, url, self.path, self.payload, request_id=self.rid
        )
        return self.parser.fetch(request, expected_items=self.expected_items)

    def finish(self, response: ParsedBody) -> ParsedBody:
        return response


def _stopped(samples: list[Sample]) -> list[Sample]:
    """The run stopped while the microgroup waited for an engine slot: never sent."""
    for sample in samples:
        sample.status = SampleStatus.ABORTED
        sample.status_reason = "early_stop"
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
