"""One ``/generate`` request of a text sample: sent through the router's one retry loop,
counted in the run's requests in flight, its answer checked before anything of it
reaches the sample (token in, token out).

Public because custom generate functions need them: :func:`post_generate`,
:func:`apply_answer`, :func:`append_env_tokens`. Token ids and log-probs always come from
the engine's ``meta_info.output_token_logprobs``, never from re-tokenized text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Any

from miles_lite.engine.http.response import RawResponse
from miles_lite.errors import EngineTimeoutError
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.generate_wire import GENERATE_PATH, GenerateAnswer, decode_generate_answer
from miles_lite.text.context import TextContext
from miles_lite.types import Sample

__all__ = ["append_env_tokens", "apply_answer", "post_generate"]

#: Bound on aborting a request that timed out at its engine (seconds).
_TIMEOUT_ABORT_S = 2.0


class _Stopped(Exception):
    """The run stopped while the request waited for an engine slot: it is not sent."""


async def post_generate(
    ctx: TextContext, run: RunContext, payload: dict[str, Any], span: UnitSpan | None = None
) -> GenerateAnswer | None:
    """POST ``payload`` to an engine the router leases and return its checked answer;
    ``None`` when the run stopped before the request was sent (it waited for a slot).

    The rid counts as in flight in ``run`` (at the engine that got it, so an early stop
    aborts it there); only what never reached an engine, or a 502/503/504, is sent again,
    to another engine. A request that timed out is aborted at its engine (it may still be
    generating). Once the engines were updated, the request carries the current version's
    cache key (``extra_key``), and tokens it made on KV from before an update are marked
    (:attr:`WeightSpan.kv_version <miles_lite.types.WeightSpan.kv_version>`). Raises the
    engine client's typed errors (an engine 400 as ``EngineStatusError`` with SGLang's
    message) and ``EngineProtocolError`` for an answer that breaks the format.
    """
    rid = payload["rid"]
    send = _Send(ctx, run, payload, rid, span)
    with run.in_flight.track(rid):
        try:
            answer = await ctx.router.call(send)
        except _Stopped:
            return None
        except EngineTimeoutError as exc:
            if not exc.retryable and send.url is not None:
                # The engine got it and learns of the timeout only from the closed
                # connection: stop the generation there.
                await ctx.router.abort_request(send.url, rid, timeout_s=_TIMEOUT_ABORT_S)
            raise
    parsed = decode_generate_answer(answer.body, rid=rid, url=send.url, vocab_size=ctx.vocab_size)
    versions = ctx.router.versions
    if versions.current is not None and parsed.weight_spans:
        # Across a weight update (or sent just before one): mark tokens made on older KV.
        marked = versions.mark_kv(
            parsed.weight_spans, sent_under=send.version, cached_tokens=parsed.cached_tokens
        )
        if marked != parsed.weight_spans:
            parsed = replace(parsed, weight_spans=marked)
    return parsed


class _Send:
    """One attempt of :func:`post_generate` on the engine the router leased (``fn`` of
    ``Router.call``); remembers where and under which weight version it went last.

    A small object rather than a closure: one per request, on the hot path."""

    __slots__ = ("ctx", "payload", "rid", "run", "span", "url", "version")

    def __init__(
        self,
        ctx: TextContext,
        run: RunContext,
        payload: dict[str, Any],
        rid: str,
        span: UnitSpan | None,
    ) -> None:
        self.ctx, self.run, self.payload, self.rid, self.span = ctx, run, payload, rid, span
        self.url: str | None = None
        self.version: str | None = None

    def __call__(self, url: str) -> Awaitable[RawResponse]:
        # Not a coroutine itself: it does its bookkeeping and hands back the client's, one
        # coroutine level less per request (Router.call awaits the result; _Stopped raised
        # here is raised inside its try, as an awaited one would be).
        run, rid, payload = self.run, self.rid, self.payload
        # Checked after the slot is taken: a request still waiting at the stop is never
        # sent (it would run to its end: the abort went out before it).
        if run.stopping:
            raise _Stopped
        run.in_flight.sent_to(rid, url)
        self.url = url
        # Read at send time: a request held while the weights were updated goes out with
        # the new version's cache key, so it never reuses KV computed before the update.
        router = self.ctx.router
        versions = router.versions
        self.version = versions.current
        cache_key = versions.cache_key()
        if cache_key is not None:
            payload["extra_key"] = cache_key
        span = self.span
        if span is not None:
            span.engine = url
            span.requests += 1
            span.leased()
        return router.client.post(url, GENERATE_PATH, payload, request_id=rid, retry=False)


def apply_answer(sample: Sample, answer: GenerateAnswer) -> None:
    """Append a checked answer's output to ``sample`` and set its status.

    ``sample.tokens`` must already hold everything the request was sent with. The loss
    mask is 1 on the output; its log-probs are the engine's; the weight version spans are
    shifted to the response's offsets; prefix-cache counts add up.
    """
    offset = sample.response_length
    n = len(answer.ids)
    sample.tokens += answer.ids
    sample.response += answer.text
    sample.response_length += n
    sample.loss_mask = _grown(sample.loss_mask, [1] * n)
    sample.rollout_log_probs = _grown(sample.rollout_log_probs, answer.log_probs)
    if answer.weight_spans:
        sample.weight_versions.append(answer.weight_spans[-1].version)
        sample.weight_spans.extend(
            answer.weight_spans  # immutable: the first request's spans are kept as they are
            if offset == 0
            else (
                replace(s, start=s.start + offset, end=s.end + offset) for s in answer.weight_spans
            )
        )
    sample.request_id = answer.rid
    sample.status = answer.status
    sample.finish_reason = answer.finish_reason
    sample.matched_stop = answer.matched_stop
    sample.prefix_cache_info.cached_tokens += answer.cached_tokens
    sample.prefix_cache_info.total_prompt_tokens += answer.prompt_tokens


def append_env_tokens(sample: Sample, ids: Sequence[int], text: str = "") -> None:
    """Append tokens the model did not generate (tool results, template glue): loss mask 0,
    log-prob 0.0."""
    sample.tokens += ids
    sample.response += text
    sample.response_length += len(ids)
    sample.loss_mask = _grown(sample.loss_mask, [0] * len(ids))
    sample.rollout_log_probs = _grown(sample.rollout_log_probs, [0.0] * len(ids))


def _grown(values: Any, more: list[Any]) -> list[Any]:
    if values is None:
        return more
    if type(values) is not list:
        values = list(values)
    values += more
    return values  # type: ignore[no-any-return]
