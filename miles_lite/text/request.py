"""Building ``/generate`` requests from samples and samples from answers (token in, token out).

Public because custom generate functions need them: :func:`prompt_ids`,
:func:`sample_prompt_ids` (text, chat, given ids or multimodal),
:func:`build_generate_payload`, :func:`post_generate`, :func:`apply_generate_answer`,
:func:`append_env_tokens`, :func:`check_text_sample`. Token ids and log-probs always come from the engine's
``meta_info.output_token_logprobs``, never from re-tokenized text.
"""

from __future__ import annotations

import base64
import io
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from miles_lite.errors import EngineProtocolError, GenerateError
from miles_lite.rollout.spans import UnitSpan
from miles_lite.sglang.sampling import check_sampling_params
from miles_lite.text.context import TextState
from miles_lite.types import Sample, SampleStatus

__all__ = [
    "GENERATE_PATH",
    "append_env_tokens",
    "apply_generate_answer",
    "build_generate_payload",
    "check_text_sample",
    "image_data_urls",
    "new_rid",
    "post_generate",
    "prompt_ids",
    "sample_prompt_ids",
    "status_of",
]

GENERATE_PATH = "/generate"

_STATUS = {
    "stop": SampleStatus.COMPLETED,
    "length": SampleStatus.TRUNCATED,
    "abort": SampleStatus.ABORTED,
}


def new_rid() -> str:
    """A fresh request id: 32 hex digits, so that no rid is a prefix of another (SGLang
    aborts by rid prefix)."""
    return uuid.uuid4().hex


async def prompt_ids(
    state: TextState, prompt: str | list[dict[str, Any]], *, tools: Sequence[Any] | None = None
) -> list[int]:
    """The token ids of a text prompt, or of a chat ``messages`` list through the
    tokenizer's chat template (with the generation prompt and ``tools``). Off the loop."""
    tokenizer = state.tokenizer
    if isinstance(prompt, str):
        ids = await state.off_loop(lambda: tokenizer.encode(prompt, add_special_tokens=False))
    else:
        ids = await state.off_loop(
            lambda: tokenizer.apply_chat_template(
                prompt,
                tools=list(tools) if tools else None,
                add_generation_prompt=True,
                tokenize=True,
            )
        )
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding for chat templates
        ids = list(ids["input_ids"])
    return [int(i) for i in ids]


async def sample_prompt_ids(
    state: TextState, sample: Sample, *, tools: Sequence[Any] | None = None
) -> list[int]:
    """The prompt ids of ``sample``, as miles' ``compute_prompt_ids_from_sample``.

    - multimodal (``state.processor`` set and ``sample.multimodal_inputs`` holding
      ``images``): the text (a chat prompt through the tokenizer's template) and the
      images go through the processor, which expands the image placeholders; its other
      outputs (``pixel_values``, ``image_grid_thw``) land in
      ``sample.multimodal_train_inputs``;
    - given ids (``sample.tokens`` set before any response): sent as they are;
    - otherwise :func:`prompt_ids`. Everything runs off the loop.
    """
    images = (sample.multimodal_inputs or {}).get("images")
    if images:
        if state.processor is None:
            raise GenerateError(
                f"sample {sample.index} has images but the TextState has no processor",
                request_id=sample.request_id,
            )
        text = await _prompt_text(state, sample.prompt, tools)
        ids, train_inputs = await state.off_loop(_process, state.processor, text, list(images))
        sample.multimodal_train_inputs = train_inputs
        return ids
    if sample.tokens and sample.response_length == 0:
        return list(map(int, sample.tokens))
    return await prompt_ids(state, sample.prompt, tools=tools)


async def _prompt_text(state: TextState, prompt: Any, tools: Sequence[Any] | None) -> str:
    if isinstance(prompt, str):
        return prompt
    tokenizer = state.tokenizer
    text = await state.off_loop(
        lambda: tokenizer.apply_chat_template(
            prompt, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False
        )
    )
    return str(text)


def _process(processor: Any, text: str, images: list[Any]) -> tuple[list[int], dict[str, Any]]:
    out = processor(text=[text], images=images, return_tensors="pt")
    ids = [int(i) for i in out["input_ids"][0]]
    train = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    return ids, train


async def image_data_urls(state: TextState, images: Sequence[Any]) -> list[str]:
    """``image_data`` for a request: strings (URLs, data URLs, paths) as given, PIL images
    as base64 PNG data URLs (encoded off the loop)."""
    return [
        image if isinstance(image, str) else await state.off_loop(_png_data_url, image)
        for image in images
    ]


def _png_data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def build_generate_payload(
    sample: Sample,
    input_ids: Sequence[int],
    sampling_params: Mapping[str, Any],
    *,
    rid: str | None = None,
    image_data: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``/generate`` body: ids in, ids and log-probs out, a fresh fixed-length rid.

    ``return_logprob`` without ``logprob_start_len`` (its default, -1, asks for output
    log-probs only and keeps the prefix cache useful); ``sampling_seed`` from the
    sample's seed unless given; ``image_data`` (data URLs) for multimodal prompts.
    Raises SamplingParamsError on a key SGLang refuses.
    """
    params = check_sampling_params(sampling_params)
    if sample.seed is not None:
        params.setdefault("sampling_seed", sample.seed)
    payload: dict[str, Any] = {
        "input_ids": list(map(int, input_ids)),
        "sampling_params": params,
        "rid": rid or new_rid(),
        "return_logprob": True,
    }
    if image_data:
        payload["image_data"] = list(image_data)
    return payload


async def post_generate(
    state: TextState, payload: dict[str, Any], span: UnitSpan | None = None
) -> dict[str, Any]:
    """POST ``payload`` to an engine the router leases; its rid counts as in flight.

    Raises the engine client's typed errors (an engine 400 as ``EngineStatusError`` with
    SGLang's message), and EngineProtocolError when the answer is not one JSON object.
    """
    rid = payload["rid"]
    with state.in_flight.track(rid):
        answer = await _send(state, payload, rid, span)
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise EngineProtocolError(
            f"/generate answered {type(answer).__name__}, not one object with meta_info",
            request_id=rid,
        )
    return answer


async def _send(state: TextState, payload: dict[str, Any], rid: str, span: UnitSpan | None) -> Any:
    # The one place a /generate goes out: through the router's one retry loop (only what
    # never reached an engine, or a 502/503/504, is retried, on another engine), under its
    # per-engine in-flight bound; the client itself never retries.
    client = state.router.client

    async def attempt(url: str) -> Any:
        if span is not None:
            span.engine = url
            span.requests += 1
        return await client.post_json(url, GENERATE_PATH, payload, request_id=rid, retry=False)

    return await state.router.call(attempt)


def status_of(answer: Mapping[str, Any]) -> SampleStatus:
    """The sample status an answer's ``finish_reason`` means (stop, length, abort)."""
    finish = answer["meta_info"].get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in _STATUS:
        raise EngineProtocolError(
            f"unexpected finish_reason {finish!r}", request_id=answer["meta_info"].get("id")
        )
    return _STATUS[kind]


def apply_generate_answer(sample: Sample, answer: Mapping[str, Any]) -> list[int]:
    """Append one answer's output to ``sample`` and set its status; return the new ids.

    ``sample.tokens`` must already hold everything the request was sent with. Output ids
    and log-probs come from ``meta_info.output_token_logprobs`` (checked against
    ``output_ids``); the loss mask is 1 on them; ``weight_versions`` gets the answer's
    version. Raises EngineProtocolError on an answer that does not line up.
    """
    meta = answer["meta_info"]
    rid = meta.get("id")
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise EngineProtocolError("answer has no output_token_logprobs", request_id=rid)
    ids = [int(t[1]) for t in triples]
    if ids != list(answer.get("output_ids", ids)):
        raise EngineProtocolError(
            f"output_token_logprobs ids {ids[:8]}... differ from output_ids", request_id=rid
        )
    log_probs = [float(t[0]) if t[0] is not None else 0.0 for t in triples]
    status = status_of(answer)
    sample.tokens = [*sample.tokens, *ids]
    sample.response += str(answer.get("text", ""))
    sample.response_length += len(ids)
    sample.loss_mask = [*(sample.loss_mask or []), *([1] * len(ids))]
    sample.rollout_log_probs = [*_as_list(sample.rollout_log_probs), *log_probs]
    version = meta.get("weight_version")
    if version is not None:
        sample.weight_versions.append(str(version))
    sample.request_id = rid
    sample.status = status
    finish = meta["finish_reason"]
    sample.metadata["finish_reason"] = finish.get("type")
    if "matched" in finish:
        sample.metadata["matched_stop"] = finish["matched"]
    sample.prefix_cache_info.cached_tokens += int(meta.get("cached_tokens") or 0)
    sample.prefix_cache_info.total_prompt_tokens += int(meta.get("prompt_tokens") or 0)
    sample.metadata["received_at"] = time.time()
    return ids


def append_env_tokens(sample: Sample, ids: Sequence[int], text: str = "") -> None:
    """Append tokens the model did not generate (tool results, template glue): loss mask 0,
    log-prob 0.0."""
    sample.tokens = [*sample.tokens, *ids]
    sample.response += text
    sample.response_length += len(ids)
    sample.loss_mask = [*(sample.loss_mask or []), *([0] * len(ids))]
    sample.rollout_log_probs = [*_as_list(sample.rollout_log_probs), *([0.0] * len(ids))]


def check_text_sample(sample: Sample) -> None:
    """Check miles' invariants: ``len(tokens) >= response_length`` and every per-token list
    (``loss_mask``, ``rollout_log_probs``) has ``response_length`` entries.

    Raises :class:`~miles_lite.errors.SampleInvariantError` naming the sample and field.
    """
    sample.validate()


def _as_list(values: Any) -> list[float]:
    if values is None:
        return []
    return list(values)
