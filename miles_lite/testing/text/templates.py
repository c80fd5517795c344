"""Chat-template renders of the text stand-in, cached by conversation.

:class:`TemplateCache` turns a ``/v1/chat/completions`` body (``messages``, ``tools``,
``chat_template_kwargs``) into prompt token ids with the tokenizer's chat template, once
per distinct conversation; a template that fails is SGLang's 400
(:class:`~miles_lite.testing.text.validate.ChatBadRequest`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import anyio
import anyio.to_thread

from miles_lite.testing.text.validate import ChatBadRequest
from miles_lite.testing.tokenizers import fast_encode

__all__ = ["TemplateCache"]


class TemplateCache:
    """Chat-template renders, kept by conversation (LRU, ``size`` entries).

    Rendering the Qwen3 template costs about a millisecond per short conversation; a
    benchmark sends the same few conversations thousands of times.
    """

    def __init__(self, tokenizer: Any, size: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self.hits = 0
        self._cache: OrderedDict[str, list[int]] = OrderedDict()

    async def prompt_ids(self, body: dict[str, Any], limiter: Any = None) -> list[int]:
        """The templated prompt of a chat body (its ``input_ids`` when it gives them).

        A render that is not cached runs in a worker thread (``limiter``, an anyio
        CapacityLimiter, bounds them): a long conversation takes longer to render and
        encode than an event-loop step may.
        """
        ids = body.get("input_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ChatBadRequest("1 validation error: input_ids: Input should be a list")
            return list(ids)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ChatBadRequest(
                "1 validation error: chat_template_kwargs: Input should be a valid dictionary"
            )
        key = json.dumps([body["messages"], body.get("tools"), kwargs], sort_keys=True)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        messages = _normalized(body["messages"])
        rendered: list[int] = await anyio.to_thread.run_sync(
            self._render, messages, body.get("tools") or None, kwargs, limiter=limiter
        )
        self._cache[key] = rendered
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return rendered

    def _render(self, messages: list[Any], tools: Any, kwargs: dict[str, Any]) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja errors, a bad message, ...
            raise ChatBadRequest(f"cannot apply the chat template: {exc}") from exc
        return fast_encode(self.tokenizer, text)


def _normalized(messages: list[Any]) -> list[Any]:
    # The Qwen3 template iterates tool_call.arguments as a mapping when it is not a
    # string; OpenAI clients send a JSON string, which the template embeds as is.
    out = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ChatBadRequest("1 validation error: messages: each needs a role")
        if message.get("content") is None and message["role"] == "assistant":
            message = {**message, "content": ""}
        out.append(message)
    return out
