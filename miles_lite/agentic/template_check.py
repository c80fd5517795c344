"""Is a chat template append-only for a conversation? Where does it rewrite history?

TITO merges a session's turns only when each prompt starts with the tokens so far (the
previous prompt and the model's output). A template that re-renders earlier messages
differently (the real Qwen3 template drops ``<think>`` blocks of assistant turns before
the last user message) breaks that, and the session's samples split there.
:func:`check_append_only` tells, for one conversation, whether that happens and where.
Blocking (it runs the tokenizer): call it from a worker thread in async code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AppendOnlyReport", "TemplateBreak", "check_append_only"]

#: Characters of context shown on each side of a break.
_CONTEXT_CHARS = 60


@dataclass(frozen=True, slots=True)
class TemplateBreak:
    """Where a later prompt stops extending an earlier turn.

    ``message_index``: the assistant message whose rendering changed; ``next_index``: the
    assistant message whose prompt re-rendered it; ``token_index``: the first token that
    differs; ``rendered`` / ``re_rendered``: the text from there on as the turn was
    generated and as the later prompt has it (shortened).
    """

    message_index: int
    next_index: int
    token_index: int
    rendered: str
    re_rendered: str


@dataclass(frozen=True, slots=True)
class AppendOnlyReport:
    """``append_only`` when no break was found; ``checked``: assistant turns compared."""

    append_only: bool
    checked: int
    breaks: tuple[TemplateBreak, ...]

    def __str__(self) -> str:
        if self.append_only:
            return f"append-only over {self.checked} assistant turn(s)"
        lines = [f"not append-only: {len(self.breaks)} break(s)"]
        lines.extend(
            f"  message {b.message_index} re-rendered in the prompt of message "
            f"{b.next_index} from token {b.token_index}: {b.rendered!r} -> {b.re_rendered!r}"
            for b in self.breaks
        )
        return "\n".join(lines)


def check_append_only(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> AppendOnlyReport:
    """Check ``messages`` turn by turn as a TITO session would see them.

    For each assistant message ``k``, the tokens of the conversation up to and including
    it (as the template renders it when it is the newest message, standing in for what the
    model generated) must be a prefix of the prompt of the next assistant message (or of
    a generation prompt after the last message). ``template_kwargs`` reach
    ``apply_chat_template`` (``enable_thinking=False``, ...).
    """
    messages = list(messages)
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    breaks = []
    for k in assistants:
        later = [j for j in assistants if j > k]
        nxt = later[0] if later else len(messages)
        if nxt == k + 1 and nxt == len(messages):
            continue  # the last message: nothing re-renders it
        turn = _ids(tokenizer, messages[: k + 1], tools, False, template_kwargs)
        prompt = _ids(tokenizer, messages[:nxt], tools, True, template_kwargs)
        at = _first_difference(turn, prompt)
        if at is not None:
            breaks.append(
                TemplateBreak(
                    message_index=k,
                    next_index=nxt,
                    token_index=at,
                    rendered=_text(tokenizer, turn[at:]),
                    re_rendered=_text(tokenizer, prompt[at:]),
                )
            )
    checked = sum(1 for k in assistants if k < len(messages) - 1)
    return AppendOnlyReport(append_only=not breaks, checked=checked, breaks=tuple(breaks))


def _ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    generation_prompt: bool,
    kwargs: dict[str, Any],
) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages,
        tools=list(tools) if tools else None,
        add_generation_prompt=generation_prompt,
        tokenize=False,
        **kwargs,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def _first_difference(turn: list[int], prompt: list[int]) -> int | None:
    for i, token in enumerate(turn):
        if i >= len(prompt) or prompt[i] != token:
            return i
    return None


def _text(tokenizer: Any, ids: list[int]) -> str:
    text = str(tokenizer.decode(ids[:40], skip_special_tokens=False))
    return text[:_CONTEXT_CHARS]
