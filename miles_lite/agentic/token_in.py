"""Token in, token out for chat sessions: a turn that extends its session is sent as the
trajectory's own ids plus the tokens of the messages the agent appended (``input_ids``),
so the model's earlier output is never re-tokenized (a model's ``\\n\\n\\n`` is three
tokens, the tokenizer's spelling of it one); an agent that rewrites its history is
templated anew. :class:`TokenIn` also keeps each recorded turn's new tokens only and the
session's trajectory."""

from __future__ import annotations

import dataclasses
from typing import Any

from miles_lite.agentic.config import SessionCounters, SessionServerConfig
from miles_lite.agentic.http_io import refuse
from miles_lite.agentic.registry import SessionState
from miles_lite.agentic.turns import Trajectory, appended_messages, prefix_len, render_key
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.text.context import TokenizerThreads
from miles_lite.text.template_glue import TemplateGlue
from miles_lite.text.tokenize import ids_after_turn

__all__ = ["TokenIn"]


class TokenIn:
    """The token-in half of a session server over ``threads`` (its tokenizer, with its
    chat template, and the worker threads it runs in), counting in the server's
    ``counts`` (``templated_turns``, ``token_in_turns``, ``recorded``). The appended
    messages' text comes from :attr:`glue` (the template's per-role glue where proven)
    and is templated and encoded in at most one worker-thread call a turn: none once the
    glue is proven and the text short (:func:`~miles_lite.text.tokenize.ids_after_turn`)."""

    def __init__(
        self, threads: TokenizerThreads, config: SessionServerConfig, counts: SessionCounters
    ) -> None:
        self._threads = threads
        self._config = config
        self._counts = counts
        tokenizer = threads.tokenizer
        self._end_of_turn = str(getattr(tokenizer, "eos_token", "") or "")
        eot_id = tokenizer.convert_tokens_to_ids(self._end_of_turn) if self._end_of_turn else None
        self._end_of_turn_id = eot_id if isinstance(eot_id, int) else -1
        self.glue = TemplateGlue(tokenizer)

    async def prompt_ids(
        self, session: SessionState, body: dict[str, Any], payload: dict[str, Any]
    ) -> list[int] | None:
        """Send the trajectory's ids plus the appended messages' tokens when the request
        extends the session (sets ``payload["input_ids"]``, returns them); None when the
        engine is to template the messages (a first turn, or a rewritten history)."""
        trajectory = session.trajectory
        if not self._config.token_in or trajectory is None:
            self._counts.templated_turns += 1
            return None
        appended = None
        if render_key(body) == trajectory.render_key:
            appended = appended_messages(trajectory.messages, trajectory.answer, body["messages"])
        if appended is None:
            self._counts.templated_turns += 1
            return None
        kwargs = body.get("chat_template_kwargs")
        try:
            tail = await ids_after_turn(
                self._threads,
                self.glue,
                appended,
                end_of_turn=self._end_of_turn,
                turn_ended=trajectory.turn_ended,
                template_kwargs=kwargs if isinstance(kwargs, dict) else None,
            )
        except Exception as exc:  # the template refused the agent's messages
            raise refuse(
                400, f"cannot apply the chat template: {exc}", "refused", param="messages"
            ) from exc
        ids = [*trajectory.ids, *tail]
        payload["input_ids"] = ids
        self._counts.token_in_turns += 1
        return ids

    def record(
        self, session: SessionState, record: TurnRecord, body: dict[str, Any], answer: Any
    ) -> None:
        """Keep the turn: its new prompt tokens only, and the session's trajectory."""
        prompt = record.prompt_ids
        output = record.output_ids
        trajectory = session.trajectory
        kept = 0
        if trajectory is not None:
            last_output = len(session.records[-1].output_ids) if session.records else 0
            trim = min(self._config.max_trim_tokens, last_output)
            kept = prefix_len(trajectory.ids, prompt, trim)
        session.records.append(
            dataclasses.replace(record, prompt_ids=prompt[kept:], prefix_len=kept)
        )
        self._counts.recorded += 1
        message = answer["choices"][0].get("message")
        session.trajectory = Trajectory(
            ids=[*prompt, *output],
            messages=list(body["messages"]),
            answer=message if isinstance(message, dict) else {},
            render_key=render_key(body),
            turn_ended=bool(output) and output[-1] == self._end_of_turn_id,
        )
