"""The one place a text prompt becomes token ids: plain text, chat ``messages`` through the
tokenizer's template, given ids, or text and images through a processor. Off the loop."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from miles_lite.errors import GenerateError
from miles_lite.text.context import TextContext
from miles_lite.types import Sample

__all__ = ["encode", "image_data_urls", "prompt_ids", "render", "sample_prompt_ids"]


async def render(
    ctx: TextContext,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    generation_prompt: bool = True,
) -> str:
    """``messages`` through the tokenizer's chat template, as text (with the generation
    prompt and ``tools``). Off the loop."""
    tokenizer = ctx.tokenizer
    text = await ctx.off_loop(
        lambda: tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
        )
    )
    return str(text)


async def encode(ctx: TextContext, text: str) -> list[int]:
    """The ids of ``text``, without special tokens added. Off the loop."""
    tokenizer = ctx.tokenizer
    ids = await ctx.off_loop(lambda: tokenizer.encode(text, add_special_tokens=False))
    return ids if type(ids) is list else list(ids)


async def prompt_ids(
    ctx: TextContext, prompt: str | list[dict[str, Any]], *, tools: Sequence[Any] | None = None
) -> list[int]:
    """The token ids of a text prompt, or of a chat ``messages`` list through the
    tokenizer's chat template (with the generation prompt and ``tools``). Off the loop."""
    if isinstance(prompt, str):
        return await encode(ctx, prompt)
    tokenizer = ctx.tokenizer
    ids = await ctx.off_loop(
        lambda: tokenizer.apply_chat_template(
            prompt, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=True
        )
    )
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding for chat templates
        ids = list(ids["input_ids"])
    return ids


async def sample_prompt_ids(
    ctx: TextContext, sample: Sample, *, tools: Sequence[Any] | None = None
) -> list[int]:
    """The prompt ids of ``sample``, as miles' ``compute_prompt_ids_from_sample``.

    - multimodal (``ctx.processor`` set and ``sample.multimodal_inputs`` holding
      ``images``): the text (a chat prompt through the tokenizer's template) and the
      images go through the processor, which expands the image placeholders; its other
      outputs (``pixel_values``, ``image_grid_thw``) land in
      ``sample.multimodal_train_inputs``;
    - given ids (``sample.tokens`` set before any response): sent as they are;
    - otherwise :func:`prompt_ids`. Everything runs off the loop.
    """
    images = (sample.multimodal_inputs or {}).get("images")
    if images:
        if ctx.processor is None:
            raise GenerateError(
                f"sample {sample.index} has images but the rollout has no processor",
                request_id=sample.request_id,
            )
        prompt = sample.prompt
        text = prompt if isinstance(prompt, str) else await render(ctx, prompt, tools)
        ids, train_inputs = await ctx.off_loop(_process, ctx.processor, text, list(images))
        sample.multimodal_train_inputs = train_inputs
        return ids
    if sample.tokens and sample.response_length == 0:
        return list(sample.tokens)
    return await prompt_ids(ctx, sample.prompt, tools=tools)


def _process(processor: Any, text: str, images: list[Any]) -> tuple[list[int], dict[str, Any]]:
    out = processor(text=[text], images=images, return_tensors="pt")
    ids = [int(i) for i in out["input_ids"][0]]
    train = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
    return ids, train


async def image_data_urls(ctx: TextContext, images: Sequence[Any]) -> list[str]:
    """``image_data`` for a request: strings (URLs, data URLs, paths) as given, PIL images
    as base64 PNG data URLs (encoded off the loop)."""
    return [
        image if isinstance(image, str) else await ctx.off_loop(_png_data_url, image)
        for image in images
    ]


def _png_data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
