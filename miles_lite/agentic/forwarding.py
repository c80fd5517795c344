"""Forwarding a session's turn to its engine: the chat request built from the agent's
(under the rollout's sampling, token in), sent through the one send path on the
session's engine, the answer checked and recorded. The dialects (OpenAI chat, Anthropic
Messages) differ only in how the server reads the request and writes the answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio

from miles_lite.agentic.config import SessionCounters, SessionServerConfig
from miles_lite.agentic.http_io import OFF_LOOP_JSON_BYTES, Refused, refuse
from miles_lite.agentic.openai_wire import ChatAnswer, abort_answer, engine_answer, passthrough
from miles_lite.agentic.registry import SessionState
from miles_lite.agentic.token_in import TokenIn
from miles_lite.agentic.turn_send import CHAT_PATH, Marks, TurnSender
from miles_lite.agentic.turns import BadTurn, engine_payload
from miles_lite.errors import EngineError, EngineProtocolError
from miles_lite.sglang.chat_wire import record_from_choice
from miles_lite.sglang.generate_wire import new_rid

__all__ = ["CHAT_PATH", "Forwarder"]

#: Answers with more output tokens than this are encoded in a worker thread.
_OFF_LOOP_ANSWER_TOKENS = 1024


class Forwarder:
    """The forwarding half of a session server: ``vocab_size`` bounds the ids an answer
    may hold (``None``: only that they are ints >= 0); ``sampling`` is the rollout's in
    chat names; counts in the server's ``counts``; ``sender`` gets each
    turn's payload to the engine (:mod:`miles_lite.agentic.turn_send`)."""

    def __init__(
        self,
        vocab_size: int | None,
        config: SessionServerConfig,
        sampling: dict[str, Any],
        token_in: TokenIn,
        counts: SessionCounters,
        sender: TurnSender,
    ) -> None:
        self._vocab_size = vocab_size
        self._sender = sender
        self._config = config
        self._sampling = sampling
        self._token_in = token_in
        self._counts = counts

    async def turn(self, session: SessionState, body: dict[str, Any]) -> tuple[ChatAnswer, bool]:
        """The engine's chat answer to the agent's chat ``body`` (an ``abort`` answer when
        the session may no longer send), and whether it is large (encode it off the
        loop). Records the turn. Raises :class:`Refused` with the answer to give."""
        if session.stopping:
            self._counts.aborted_answers += 1
            return ChatAnswer(abort_answer(self._model(body))), False
        rid = new_rid()
        try:
            payload = engine_payload(body, self._sampling, rid=rid)
        except BadTurn as bad:
            raise refuse(400, bad.message, "refused", param=bad.param) from None
        sent = await self._token_in.prompt_ids(session, body, payload)
        # One loop step less long: agents' turns that arrive together (their requests
        # read in one step) are prepared in one step and sent in the next, not both at
        # once (64 lockstep agents: the longest step's CPU 13-15 ms against 19-23).
        await anyio.lowlevel.checkpoint()
        forwarded = await self.forward(session, payload, rid)
        if forwarded is None:  # the run stopped while the turn waited for an engine slot
            self._counts.aborted_answers += 1
            return ChatAnswer(abort_answer(self._model(body))), False
        answer, send = forwarded
        url = send.url or ""
        try:
            record = record_from_choice(
                answer.parsed,
                rid=rid,
                engine_url=url,
                request=payload,
                vocab_size=self._vocab_size,
            )
            if sent is not None and record.prompt_ids != sent:
                raise EngineProtocolError(
                    "the engine ran another prompt than the input_ids sent (token in): is it "
                    "SGLang >= 0.5.23?",
                    url=url,
                    request_id=rid,
                )
        except EngineError as exc:
            session.engine_errors += 1
            raise refuse(502, str(exc), "engine_errors", "upstream_error") from exc
        spans = send.marked(record.weight_spans, record.cached_tokens)
        if spans is not record.weight_spans:
            record = dataclasses.replace(record, weight_spans=spans)
        if not session.closed:
            self._token_in.record(session, record, body, answer.parsed)
        return answer, len(record.output_ids) > _OFF_LOOP_ANSWER_TOKENS

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else self._config.model

    async def forward(
        self, session: SessionState, payload: dict[str, Any], rid: str
    ) -> tuple[ChatAnswer, Marks] | None:
        """The engine's answer (decoded once, its bytes kept to pass on) and what marks
        its record's spans; None when the run stopped (or the session was aborted or
        closed) before the turn was sent. Sent by the server's :class:`~miles_lite.agentic.turn_send.TurnSender`: the one
        send path in the rollout's process, reached directly or, from a worker process,
        over its link. Raises :class:`Refused` with the answer for an engine failure."""
        outcome, marks = await self._sender.send(session, payload, rid)
        kind = outcome.kind
        if kind == "stopped":
            return None
        # The sender counted a failed send in the session's engine_errors.
        if kind == "status":
            raise Refused(passthrough(outcome.status_error(rid)), "engine_errors")
        if kind == "failed":
            raise refuse(
                502, f"engine failed: {outcome.message}", "engine_errors", "upstream_error"
            )
        data = outcome.body
        try:
            if len(data) > OFF_LOOP_JSON_BYTES:
                return await anyio.to_thread.run_sync(engine_answer, data), marks
            return engine_answer(data), marks
        except ValueError as exc:
            session.engine_errors += 1
            raise refuse(
                502,
                f"engine {outcome.url} answered non-JSON to rid {rid}: {exc}",
                "engine_errors",
                "upstream_error",
            ) from exc
