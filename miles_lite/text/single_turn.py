"""``single_turn``: one ``/generate`` request per sample; resumes aborted samples.

A text prompt is tokenized, a chat ``messages`` prompt goes through the chat template,
a token prompt (``sample.tokens`` given with ``response_length == 0``) is sent as it is,
a multimodal prompt (``sample.multimodal_inputs["images"]`` and a processor) goes through
the processor and its images go as ``image_data``. An ABORTED sample (partial rollout)
continues from its tokens with what is left of its budget. A sample with no room left is
never sent: it ends TRUNCATED with ``status_reason`` ``"prompt_too_long"`` (the prompt
fills the context), ``"context_full"`` (prompt and output do) or ``"budget_spent"``
(``max_new_tokens`` already generated).

It checks what it is given (the prompt ids as they become ids; a resumed sample as a
whole, with :meth:`Sample.validate`) and builds the rest from an answer checked as it is
decoded, so its samples are valid by construction: the text kind does not validate them
again (it does for every other generate function's).
"""

from __future__ import annotations

import time
from typing import Any

from miles_lite.errors import SamplingParamsError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.sglang.generate_wire import build_generate_payload
from miles_lite.text.context import TextContext
from miles_lite.text.request import apply_answer, post_generate
from miles_lite.text.tokenize import image_data_urls, sample_prompt_ids
from miles_lite.types import Sample, SampleStatus

__all__ = ["generate", "max_new_tokens_of", "no_room_reason", "output_budget"]


def output_budget(ctx: TextContext, sample: Sample, max_new_tokens: int) -> int:
    """Output tokens this sample may still generate: its budget left, within the context."""
    left = max_new_tokens - sample.response_length
    if ctx.max_context_len is not None:
        left = min(left, ctx.max_context_len - len(sample.tokens))
    return left


def no_room_reason(ctx: TextContext, sample: Sample) -> str:
    """Why :func:`output_budget` is spent: the context (before or after some output), or
    the budget."""
    if ctx.max_context_len is not None and len(sample.tokens) >= ctx.max_context_len:
        return "prompt_too_long" if sample.response_length == 0 else "context_full"
    return "budget_spent"


def max_new_tokens_of(params: dict[str, Any]) -> int:
    """The request's ``max_new_tokens``; SamplingParamsError when it is missing or not an
    int >= 0 (the whole budget of a sample, so it is never left to the engine's default)."""
    value = params.get("max_new_tokens")
    if type(value) is not int or value < 0:
        raise SamplingParamsError(
            f"sampling key 'max_new_tokens' must be an int >= 0, got {value!r}"
        )
    return value


async def generate(input: GenerateFnInput[TextContext]) -> Sample:
    """Generate (or resume) one sample with one ``/generate`` request; see the module doc."""
    ctx, run, sample = input.context, input.run, input.sample
    if sample.status not in (SampleStatus.PENDING, SampleStatus.ABORTED):
        return sample  # already finished (carried over by a partial rollout)
    resuming = sample.status is SampleStatus.ABORTED and bool(sample.tokens)
    if resuming:
        sample.validate(vocab_size=ctx.vocab_size)  # made elsewhere: checked before it goes on
    else:
        sample.tokens = await sample_prompt_ids(ctx, sample)
    params = input.sampling_params
    budget = output_budget(ctx, sample, max_new_tokens_of(params))
    if budget <= 0:
        sample.status = SampleStatus.TRUNCATED
        sample.status_reason = no_room_reason(ctx, sample)
        return sample
    if run.stopping:
        return _stopped(sample)
    params["max_new_tokens"] = budget
    media = sample.multimodal_inputs
    images = media.get("images") if media else None
    image_data = await image_data_urls(ctx, images) if images else None
    payload = build_generate_payload(sample.tokens, params, seed=sample.seed, image_data=image_data)
    span = input.span
    if span.generate_start is None:
        span.generate_start = time.monotonic()
    answer = await post_generate(ctx, run, payload, span)
    if answer is None:
        return _stopped(sample)
    apply_answer(sample, answer)
    span.generate_end = time.monotonic()
    return sample


def _stopped(sample: Sample) -> Sample:
    """Early stop before the request was sent: ABORTED, resumable as it is."""
    sample.status = SampleStatus.ABORTED
    sample.status_reason = "early_stop"
    return sample
