"""One ``/generate`` request of a text sample: sent through the router's one retry loop,
counted in the run's requests in flight, its answer checked before anything of it
reaches the sample (token in, token out).

Public because custom generate functions need them: :func:`post_generate`,
:func:`apply_answer`, :func:`append_env_tokens`. Token ids and log-probs always come from
the engine's ``meta_info.output_token_logprobs``, never from re-tokenized text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, Protocol

from miles_lite.engine.http.response import RawResponse
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.send import Send
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.generate_stream import (
    StreamEvents,
    decode_generate_stream,
    parse_stream_chunk,
)
from miles_lite.sglang.generate_wire import GENERATE_PATH, GenerateAnswer, decode_generate_answer
from miles_lite.text.context import TextContext
from miles_lite.types import Sample, WeightSpan

__all__ = ["TOKEN_SINK", "TokenSink", "append_env_tokens", "apply_answer", "post_generate"]


class TokenSink(Protocol):
    """Who is told the tokens of a streamed generation as they come (a rollout journal):
    called with the output so far, checked (an ABORTED answer), about every
    ``every_tokens`` tokens; never awaited (it must not block)."""

    every_tokens: int

    def __call__(self, partial: GenerateAnswer) -> None: ...


#: The token sink of the generate call running in this task (set by whoever wraps the
#: call, e.g. a journal): while one is set, a one-output ``/generate`` streams.
TOKEN_SINK: ContextVar[TokenSink | None] = ContextVar("miles_lite_token_sink", default=None)


def post_generate(
    ctx: TextContext, run: RunContext, payload: dict[str, Any], span: UnitSpan | None = None
) -> Awaitable[GenerateAnswer | None]:
    """POST ``payload`` to an engine the router leases and return its checked answer;
    ``None`` when the run stopped before the request was sent (it waited for a slot).
    Await the result (a coroutine: the send path's own, no level of its own).

    Sent through the one send path (:class:`~miles_lite.rollout.send.Send`): the rid
    counts as in flight in ``run`` (at the engine that got it, so an early stop aborts it
    there); only what never reached an engine, or a 502/503/504, is sent again, to
    another engine. A request that timed out (or was reset) after reaching its engine is
    aborted there (it may still be generating). Once the engines were updated, the
    request carries the current version's cache key (``extra_key``), and tokens it made
    on KV from before an update are marked (:attr:`WeightSpan.kv_version
    <miles_lite.types.WeightSpan.kv_version>`). Raises the engine client's typed errors
    (an engine 400 as ``EngineStatusError`` with SGLang's message) and
    ``EngineProtocolError`` for an answer that breaks the format.
    """
    sink = TOKEN_SINK.get()
    params = payload.get("sampling_params") or {}
    if sink is not None and params.get("n", 1) == 1:
        # SGLang's chunk size in tokens (inside sampling_params: a top-level one is ignored).
        payload["stream"] = True
        payload["sampling_params"] = {"stream_interval": sink.every_tokens, **params}
        streamed = _StreamedGenerate(ctx.router, run, GENERATE_PATH, payload, payload["rid"], span)
        streamed.vocab_size = ctx.vocab_size
        streamed.sink = sink
        return streamed.run()
    send = _Generate(ctx.router, run, GENERATE_PATH, payload, payload["rid"], span)
    send.vocab_size = ctx.vocab_size
    return send.run()


class _Generate(Send[RawResponse, GenerateAnswer]):
    """One ``/generate`` request: its answer decoded, checked and its KV marked."""

    __slots__ = ("vocab_size",)
    vocab_size: int | None

    def request(self, url: str) -> Awaitable[RawResponse]:
        return self.router.client.post(
            url, GENERATE_PATH, self.payload, request_id=self.rid, retry=False
        )

    def finish(self, response: RawResponse) -> GenerateAnswer:
        parsed = decode_generate_answer(
            response.body, rid=self.rid, url=self.url, vocab_size=self.vocab_size
        )
        return self.marked_answer(parsed)

    def marked_answer(self, parsed: GenerateAnswer) -> GenerateAnswer:
        """``parsed`` with the tokens it made on KV from before an update marked."""
        spans = parsed.weight_spans
        if spans:
            # Across a weight update (or sent just before one): tokens made on older KV.
            marked = self.marked(spans, parsed.cached_tokens)
            if marked is not spans:
                parsed = replace(parsed, weight_spans=marked)
        return parsed


class _StreamedGenerate(_Generate):
    """A ``/generate`` that streams (``stream: true``): each chunk is checked as it comes
    and the output so far goes to ``sink`` once ``sink.every_tokens`` more tokens came;
    the answer is the last chunk, checked as a whole answer is.

    SGLang's chunks before the last name only the current weight version
    (``weight_version``), so the output so far gets the spans of the versions its chunks
    named, each chunk's new tokens under its own (a chunk that straddles an update is put
    under the newer version: at most its tokens, fewer than ``every_tokens``, are
    mislabelled until the last chunk's spans replace them)."""

    __slots__ = ("events", "seen", "sent", "sink", "spans")
    sink: TokenSink

    def request(self, url: str) -> Awaitable[RawResponse]:
        self.events = StreamEvents()  # a new attempt starts a new stream
        self.sent = self.seen = 0
        self.spans: list[WeightSpan] = []
        return self.router.client.post(
            url,
            GENERATE_PATH,
            self.payload,
            request_id=self.rid,
            retry=False,
            on_chunk=self.on_chunk,
        )

    def on_chunk(self, piece: bytes) -> None:
        payloads = [p for p in self.events.feed(piece) if p != b"[DONE]"]
        if not payloads:
            return
        # Chunks are cumulative: the last one holds everything so far.
        partial = parse_stream_chunk(
            payloads[-1], rid=self.rid, url=self.url, vocab_size=self.vocab_size
        )
        n = len(partial.ids)
        if n > self.seen and partial.weight_spans:
            version = partial.weight_spans[-1].version
            spans = self.spans
            if spans and spans[-1].version == version:
                spans[-1] = WeightSpan(version, spans[-1].start, n)
            else:
                spans.append(WeightSpan(version, self.seen, n))
            self.seen = n
        if partial.finish_reason == "abort" and n - self.sent >= self.sink.every_tokens:
            self.sent = n
            if self.spans:
                partial = replace(partial, weight_spans=tuple(self.spans))
            self.sink(partial)

    def finish(self, response: RawResponse) -> GenerateAnswer:
        parsed = decode_generate_stream(
            response.body, rid=self.rid, url=self.url, vocab_size=self.vocab_size
        )
        return self.marked_answer(parsed)


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
