"""The one place a text prompt becomes token ids: plain text, chat ``messages`` through the
tokenizer's template, given ids, or text and images through a processor. Off the loop, but
for short text: a short prompt (:func:`prompt_ids`) and the short text after a chat turn
that proven template glue gives (:func:`ids_after_turn`)."""

from __future__ import annotations

import base64
import io
import math
import pickle
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from miles_lite.errors import GenerateError, SampleInvariantError
from miles_lite.text.context import TextContext, TokenizerThreads
from miles_lite.text.template_glue import TemplateGlue, render_after_turn
from miles_lite.types import Sample, checked_token_ids

__all__ = [
    "MESSAGE_CHARS",
    "ON_LOOP_CHARS",
    "ON_LOOP_PROMPT_CHARS",
    "encode",
    "encode_text",
    "ids_after_turn",
    "image_data_urls",
    "prompt_chars",
    "prompt_ids",
    "render",
    "sample_prompt_ids",
    "text_after_turn",
]

#: Text after a model turn up to this many characters, from proven glue, is encoded on the
#: event loop (at most ~0.2 ms there); longer text, or a full render, in a worker thread.
ON_LOOP_CHARS = 512

#: A prompt that costs at most this many characters to tokenize (:func:`prompt_chars`) is
#: tokenized on the event loop: 0.25-0.6 ms there (the Qwen3 template, Jinja included),
#: and less of the loop's CPU than a worker-thread hop when the loop is busy
#: (``benchmarks/prompts.py``: a hop a group cost the loop about 0.5 ms more than the
#: work itself). A longer one goes to a worker thread, where the encode lets the GIL go.
ON_LOOP_PROMPT_CHARS = 1024

#: What a chat message costs the template, in characters of text (a Qwen3 render takes
#: about 35 us more a message; encoding takes about 0.3 us a character).
MESSAGE_CHARS = 128

_PLAIN_MESSAGE_KEYS = frozenset({"role", "content", "name"})


async def render(
    ctx: TextContext,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """``messages`` through the tokenizer's chat template, as text (with the generation
    prompt, ``tools`` and ``template_kwargs`` such as ``enable_thinking``). Off the loop."""
    tokenizer = ctx.tokenizer
    text = await ctx.off_loop(
        lambda: tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **(template_kwargs or {}),
        )
    )
    return str(text)


async def text_after_turn(
    ctx: TextContext,
    messages: Sequence[dict[str, Any]],
    *,
    end_of_turn: str,
    turn_ended: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The text the chat template puts after a model turn for the ``messages`` that follow
    it (tool results, user turns) and the next generation prompt: what token in (TITO)
    appends to the trajectory, so that the model's own tokens are never re-tokenized.

    Rendered after a stand-in exchange, not the real history, so a template that rewrites
    earlier turns (Qwen3 drops their ``<think>`` blocks) cannot shift it. When the model's
    turn ended with its ``end_of_turn`` token (``turn_ended``), that token is its own and
    left out; otherwise the template's is glue. Exact for templates that render a
    message from itself and its neighbour's role (Qwen2/2.5/3, Llama 3, ...: see
    :func:`~miles_lite.agentic.template_check.check_append_only`). Raises GenerateError
    when the template drops the stand-in turn.
    """
    tokenizer = ctx.tokenizer
    text = await ctx.off_loop(lambda: render_after_turn(tokenizer, messages, template_kwargs))
    return _own_end_left_out(text, end_of_turn=end_of_turn, turn_ended=turn_ended)


def _own_end_left_out(text: str, *, end_of_turn: str, turn_ended: bool) -> str:
    if turn_ended and end_of_turn and text.startswith(end_of_turn):
        return text[len(end_of_turn) :]
    return text


async def ids_after_turn(
    threads: TokenizerThreads,
    glue: TemplateGlue,
    messages: Sequence[dict[str, Any]],
    *,
    end_of_turn: str,
    turn_ended: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The ids of :func:`text_after_turn`'s text, templated through ``glue`` (cached per
    role where proven, else the full render) and encoded: at most one worker-thread hop.

    On the loop, without a hop, when the glue is proven and the text at most
    :data:`ON_LOOP_CHARS` long (a join of cached strings and an encode of 20-160 us: a
    hop costs ~70 us of CPU alone, and the GIL hand-offs it sets off cost the session
    server 0.5-1 ms of CPU a turn at 64 light agents on 2 loaded cores); the full render
    (Jinja), and the encoding of longer text, in one worker-thread call."""
    tokenizer = threads.tokenizer
    text = glue.proven_text(messages, template_kwargs)
    if text is not None:
        text = _own_end_left_out(text, end_of_turn=end_of_turn, turn_ended=turn_ended)
        if len(text) <= ON_LOOP_CHARS:
            return encode_text(tokenizer, text)
        return await threads.off_loop(encode_text, tokenizer, text)

    def work() -> list[int]:
        rendered = _own_end_left_out(
            glue.text_after_turn(messages, template_kwargs),
            end_of_turn=end_of_turn,
            turn_ended=turn_ended,
        )
        return encode_text(tokenizer, rendered)

    return await threads.off_loop(work)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)`` as a list, through the Rust
    backend directly where that is the same call (:func:`_plain_backend`); safe in a
    worker thread (the GIL is let go while it encodes)."""
    backend = _plain_backend(tokenizer)
    if backend is not None:
        # A batch call, as transformers makes: it lets the GIL go while it encodes.
        batch = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets
        return batch([text], add_special_tokens=False)[0].ids  # type: ignore[no-any-return]
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids if type(ids) is list else list(ids)


def _plain_backend(tokenizer: Any) -> Any | None:
    """The Rust tokenizer that ``tokenizer.encode(text, add_special_tokens=False)`` hands
    ``text`` to, when calling it directly is that very call without transformers' own
    work around it (17 of 33 us for a turn's glue text, offsets not tracked): a
    ``TokenizersBackend`` (transformers 5) whose class encodes as transformers' own, with
    no truncation or padding set on its backend and special tokens split as the tokenizer
    says. Else None (the tokenizer's own ``encode`` is used)."""
    module = sys.modules.get("transformers.tokenization_utils_tokenizers")
    backend_cls = getattr(module, "TokenizersBackend", None)
    base = sys.modules.get("transformers.tokenization_utils_base")
    if backend_cls is None or base is None or not isinstance(tokenizer, backend_cls):
        return None
    cls = type(tokenizer)
    if (
        cls.encode is not base.PreTrainedTokenizerBase.encode
        or cls._encode_plus is not backend_cls._encode_plus
    ):
        return None
    backend = tokenizer.backend_tokenizer
    if (
        backend.truncation is not None
        or backend.padding is not None
        or backend.encode_special_tokens != bool(tokenizer.split_special_tokens)
    ):
        return None
    return backend


async def encode(ctx: TextContext, text: str) -> list[int]:
    """The ids of ``text``, without special tokens added. Off the loop."""
    return await ctx.off_loop(encode_text, ctx.tokenizer, text)


async def prompt_ids(
    ctx: TextContext, prompt: str | list[dict[str, Any]], *, tools: Sequence[Any] | None = None
) -> list[int]:
    """The token ids of a text prompt, or of a chat ``messages`` list through the
    tokenizer's chat template (with the generation prompt and ``tools``).

    A chat prompt is rendered and its text encoded without special tokens added: what
    ``apply_chat_template(..., tokenize=True)`` does, through :func:`encode_text` (a
    fifth less CPU for a 160-token prompt here: transformers' own call builds a
    ``BatchEncoding`` around the encode). A short prompt (:func:`prompt_chars` at most
    :data:`ON_LOOP_PROMPT_CHARS`, no ``tools``) on the event loop, anything longer in one
    worker-thread call."""
    tokenizer = ctx.tokenizer

    def work() -> list[int]:
        if isinstance(prompt, str):
            return encode_text(tokenizer, prompt)
        text = tokenizer.apply_chat_template(
            prompt, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False
        )
        return encode_text(tokenizer, text)

    chat = not isinstance(prompt, str)
    # The first render compiles the template (about 20 ms): in a worker thread.
    if (
        tools is None
        and (ctx.chat_template_compiled or not chat)
        and prompt_chars(prompt) <= ON_LOOP_PROMPT_CHARS
    ):
        return work()
    ids = await ctx.off_loop(work)
    ctx.chat_template_compiled |= chat and tools is None  # with tools: maybe another one
    return ids


def prompt_chars(prompt: str | list[dict[str, Any]]) -> float:
    """How much tokenizing ``prompt`` costs, in characters of text: its length, or a chat
    prompt's text with :data:`MESSAGE_CHARS` more a message for the template's work;
    infinite for a message holding more than a role, a name and text content (tool
    calls, content parts: the template does more for those)."""
    if isinstance(prompt, str):
        return len(prompt)
    total = 0
    for message in prompt:
        content = message.get("content")
        if not (isinstance(content, str) and message.keys() <= _PLAIN_MESSAGE_KEYS):
            return math.inf
        total += len(content) + MESSAGE_CHARS
    return total


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
    - otherwise :func:`prompt_ids` (a short prompt on the loop, the rest off it); the
      processor off the loop.

    The ids come back as a new list, checked (ints in ``[0, ctx.vocab_size)``): a bad one
    raises :class:`~miles_lite.errors.SampleInvariantError` naming it, before anything is
    sent. A text or chat prompt is tokenized once for the samples of its group (they ask
    together: the first one's call is shared, ``ctx.recent_prompts``), and once again
    only after it left the recent ones; prompts are told apart by their content (an
    equal pickle), never by the object, which a caller may change between runs.
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
        return _checked(ctx, sample, ids)
    if sample.tokens and sample.response_length == 0:
        return _checked(ctx, sample, sample.tokens)

    async def make() -> list[int]:
        return _checked(ctx, sample, await prompt_ids(ctx, sample.prompt, tools=tools))

    async def make_kept() -> array[int]:
        return array("q", await make())

    key = _prompt_key(sample.prompt, tools)
    return await make() if key is None else await ctx.recent_prompts.get(key, make_kept)


def _prompt_key(prompt: Any, tools: Sequence[Any] | None) -> str | bytes | None:
    """What tells a prompt (and its ``tools``) apart from another: the text itself, or the
    pickle of both (types kept: ``1``, ``1.0`` and ``True`` differ, as a list and a
    tuple do); None when it does not pickle (never shared)."""
    if tools is None and type(prompt) is str:
        return prompt
    try:
        return pickle.dumps((prompt, tools), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # anything a user's object raises: it is tokenized on its own
        return None


def _checked(ctx: TextContext, sample: Sample, ids: Sequence[int]) -> list[int]:
    try:
        return checked_token_ids(ids, ctx.vocab_size, name="prompt ids")
    except SampleInvariantError as exc:
        raise SampleInvariantError(
            f"sample {sample.index}: {exc}", request_id=sample.request_id
        ) from None


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
