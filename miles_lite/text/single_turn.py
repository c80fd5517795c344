"""``single_turn``: one ``/generate`` request per sample; resumes aborted samples.

A text prompt is tokenized, a chat ``messages`` prompt goes through the chat template,
a token prompt (``sample.tokens`` given with ``response_length == 0``) is sent as it is,
a multimodal prompt (``sample.multimodal_inputs["images"]`` and a ``state.processor``)
goes through the processor and its images go as ``image_data``.
An ABORTED sample (partial rollout) continues from its tokens with what is left of its
budget. A sample with no room left is never sent: it ends TRUNCATED with
``metadata["truncated_reason"]`` ``"prompt_too_long"`` (the prompt fills the context),
``"context_full"`` (prompt and output do) or ``"budget_spent"`` (``max_new_tokens``
already generated).
"""

from __future__ import annotations

import time
from typing import Any

from miles_lite.errors import SamplingParamsError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.text.context import TextState
from miles_lite.text.request import (
    apply_generate_answer,
    build_generate_payload,
    check_text_sample,
    image_data_urls,
    post_generate,
    sample_prompt_ids,
)
from miles_lite.types import Sample, SampleStatus

__all__ = ["generate", "max_new_tokens_of", "no_room_reason", "output_budget"]


def output_budget(state: TextState, sample: Sample, max_new_tokens: int) -> int:
    """Output tokens this sample may still generate: its budget left, within the context."""
    left = max_new_tokens - sample.response_length
    if state.max_context_len is not None:
        left = min(left, state.max_context_len - len(sample.tokens))
    return left


def no_room_reason(state: TextState, sample: Sample) -> str:
    """Why :func:`output_budget` is spent: the context (before or after some output), or
    the budget."""
    if state.max_context_len is not None and len(sample.tokens) >= state.max_context_len:
        return "prompt_too_long" if sample.response_length == 0 else "context_full"
    return "budget_spent"


def max_new_tokens_of(params: dict[str, Any]) -> int:
    """The request's ``max_new_tokens``; SamplingParamsError when it is missing or not an
    int >= 0 (the whole budget of a sample, so it is never left to the engine's default)."""
    value = params.get("max_new_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SamplingParamsError(
            f"sampling key 'max_new_tokens' must be an int >= 0, got {value!r}"
        )
    return value


async def generate(input: GenerateFnInput) -> Sample:
    """Generate (or resume) one sample with one ``/generate`` request; see the module doc."""
    state: TextState = input.state
    sample = input.sample
    if sample.status not in (SampleStatus.PENDING, SampleStatus.ABORTED):
        return sample  # already finished (carried over by a partial rollout)
    resuming = sample.status is SampleStatus.ABORTED and bool(sample.tokens)
    if not resuming:
        sample.tokens = await sample_prompt_ids(state, sample)
    params: dict[str, Any] = dict(input.sampling_params)
    budget = output_budget(state, sample, max_new_tokens_of(params))
    if budget <= 0:
        sample.status = SampleStatus.TRUNCATED
        sample.metadata["truncated_reason"] = no_room_reason(state, sample)
        return sample
    if state.stopping:
        sample.status = SampleStatus.ABORTED  # early stop: never sent
        return sample
    params["max_new_tokens"] = budget
    images = (sample.multimodal_inputs or {}).get("images")
    image_data = await image_data_urls(state, images) if images else None
    payload = build_generate_payload(sample, sample.tokens, params, image_data=image_data)
    span = input.span
    if span.generate_start is None:
        span.generate_start = time.monotonic()
    answer = await post_generate(state, payload, span)
    apply_generate_answer(sample, answer)
    span.generate_end = time.monotonic()
    check_text_sample(sample)
    return sample
