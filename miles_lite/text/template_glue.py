"""The chat template's text after a model turn, without Jinja where it is provably the same.

Token in appends, after a model turn, the text the template renders for the messages that
follow it (tool results, user turns) plus the next generation prompt. For plain messages
(a role and string content) most templates render ``glue[0] + content[0] + glue[1] + ...
+ glue[n]``, where the glue depends on the roles only. :class:`TemplateGlue` derives that
glue once per (template, role sequence, template kwargs) by rendering sentinel contents,
twice with different sentinels that carry edge whitespace (a template that trims or
rewrites content does not give the sentinel back, and is never cached), and proves it at
the first real use by rendering the messages in full and comparing; a key that fails
either check renders in full for good. A message with ``tool_calls``, a ``name``,
non-string content, or any other field the template's source names is always rendered in
full. :meth:`TemplateGlue.text_after_turn` is synchronous CPU work (Jinja renders): call it
from a worker thread; :meth:`TemplateGlue.proven_text` never renders (a cached join), so it
may run on the event loop, and the two may run at once in two threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from miles_lite.errors import GenerateError

__all__ = ["ANCHOR", "TemplateGlue", "render_after_turn"]

#: An invisible separator no template adds by itself: where a stand-in turn ends.
ANCHOR = "\u2063"

#: The exchange rendered before the messages, so the model turn's end can be found.
_STAND_IN = ({"role": "user", "content": "."}, {"role": "assistant", "content": ANCHOR})

#: Fields that always send a message to the full render, whatever the template says.
_NEVER_GLUED = frozenset({"tool_calls", "name", "function_call"})

#: Keys kept at most; past it new shapes render in full (no eviction churn).
_MAX_KEYS = 1024


def render_after_turn(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The full render: ``messages`` after a stand-in model turn through the tokenizer's
    template, with the generation prompt; the text after the turn's content. Raises
    GenerateError when the template drops the stand-in turn."""
    full = str(
        tokenizer.apply_chat_template(
            [*_STAND_IN, *messages],
            add_generation_prompt=True,
            tokenize=False,
            **(template_kwargs or {}),
        )
    )
    at = full.rfind(ANCHOR)
    if at < 0:
        raise GenerateError(
            "the chat template dropped the assistant message; cannot place the turns after it"
        )
    return full[at + len(ANCHOR) :]


def _sentinel(series: str, index: int) -> str:
    # Edge whitespace catches trim/strip filters; the word joiners make it unlike any text.
    return f" \n\u2060{series}{index}\u2060\n "


def _joined(glue: tuple[str, ...], messages: Sequence[dict[str, Any]]) -> str:
    parts = [glue[0]]
    for message, after in zip(messages, glue[1:], strict=True):
        parts.append(message["content"])
        parts.append(after)
    return "".join(parts)


class TemplateGlue:
    """Glue cache for one tokenizer's chat template; counts ``glued`` and ``rendered``
    calls (``rendered`` includes the proofs)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._glue: dict[tuple[object, ...], tuple[str, ...] | None] = {}
        self._proven: set[tuple[object, ...]] = set()
        # The counters are bumped from the loop (proven_text) and a worker thread.
        self._count_lock = threading.Lock()
        self.glued = 0
        self.rendered = 0

    def proven_text(
        self, messages: Sequence[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
    ) -> str | None:
        """What :meth:`text_after_turn` gives, when glue already proven for these
        messages' roles and ``template_kwargs`` makes it (a join of cached strings, no
        Jinja: cheap enough for the event loop); None when it would render (call
        :meth:`text_after_turn` then, off the loop)."""
        key = self._key(messages, template_kwargs)
        if key is None or key not in self._proven:
            return None
        glue = self._glue.get(key)
        if glue is None:  # never for a proven key (its glue is set before it is proven)
            return None
        self._count_glued()
        return _joined(glue, messages)

    def text_after_turn(
        self, messages: Sequence[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
    ) -> str:
        """What :func:`render_after_turn` gives, from cached glue where it is proven."""
        key = self._key(messages, template_kwargs)
        if key is None:
            return self._render(messages, template_kwargs)
        if key not in self._glue:
            if len(self._glue) >= _MAX_KEYS:
                return self._render(messages, template_kwargs)
            self._glue[key] = self._derive(messages, template_kwargs)
        glue = self._glue[key]
        if glue is None:
            return self._render(messages, template_kwargs)
        text = _joined(glue, messages)
        if key not in self._proven:  # first real use: render both ways
            full = self._render(messages, template_kwargs)
            if full != text:
                self._glue[key] = None
                return full
            self._proven.add(key)
            return text
        self._count_glued()
        return text

    def _count_glued(self) -> None:
        with self._count_lock:
            self.glued += 1

    def _render(
        self, messages: Sequence[dict[str, Any]], template_kwargs: dict[str, Any] | None
    ) -> str:
        with self._count_lock:
            self.rendered += 1
        return render_after_turn(self._tokenizer, messages, template_kwargs)

    def _key(
        self, messages: Sequence[dict[str, Any]], template_kwargs: dict[str, Any] | None
    ) -> tuple[object, ...] | None:
        """(template, roles, kwargs), or None when a message must be rendered in full."""
        template = self._tokenizer.chat_template
        if not isinstance(template, str) or not messages:
            return None
        roles: list[str] = []
        for message in messages:
            role = message.get("role")
            if not isinstance(role, str) or not isinstance(message.get("content"), str):
                return None
            for field in message:
                if field in ("role", "content"):
                    continue
                if field in _NEVER_GLUED or not isinstance(field, str) or field in template:
                    return None
            roles.append(role)
        try:
            kwargs = tuple(sorted((template_kwargs or {}).items()))
            hash(kwargs)
        except TypeError:
            return None
        return (template, tuple(roles), kwargs)

    def _derive(
        self, messages: Sequence[dict[str, Any]], template_kwargs: dict[str, Any] | None
    ) -> tuple[str, ...] | None:
        """The glue around each message's content, or None when two sentinel renders
        disagree or a sentinel does not come back exactly once."""
        found: list[tuple[str, ...]] = []
        for series in ("a", "bb"):
            stand = [
                {"role": m["role"], "content": _sentinel(series, i)} for i, m in enumerate(messages)
            ]
            text = self._render(stand, template_kwargs)
            pieces: list[str] = []
            for i in range(len(stand)):
                sentinel = _sentinel(series, i)
                if text.count(sentinel) != 1:
                    return None
                before, text = text.split(sentinel)
                pieces.append(before)
            pieces.append(text)
            found.append(tuple(pieces))
        return found[0] if found[0] == found[1] else None
