"""A chat turn's engine send, on the rollout's side: what the session server's forwarder
asks for once it has built a turn's payload, and what it gets back (:class:`SendOutcome`).

:class:`TurnSend` runs the one send path (:class:`~miles_lite.rollout.send.RawSend`) on
the session's engine: the router's stickiness, the weight version's cache key, in-flight
tracking in the session's run, the stop check once the slot is taken, abort at the engine
when the turn's asker goes away or the engine fails after taking it. In-process the
forwarder calls it directly; with worker processes, a worker asks the main process for it
over the link (:mod:`miles_lite.agentic.workers`), so every engine send of a rollout
stays in the rollout's process. The outcome is plain data either way, the answer's bytes
unparsed: the forwarder parses and records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from miles_lite.agentic.config import SessionCounters, SessionServerConfig
from miles_lite.agentic.registry import SessionState
from miles_lite.engine.router import Router
from miles_lite.errors import EngineError, EngineStatusError
from miles_lite.rollout.send import RawSend
from miles_lite.types import WeightSpan

__all__ = ["CHAT_PATH", "Marks", "SendOutcome", "TurnSend", "TurnSender"]

#: The chat endpoint of the engines.
CHAT_PATH = "/v1/chat/completions"

OutcomeKind = Literal["ok", "stopped", "status", "failed"]


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """How a turn's send ended: ``ok`` (``body``: the engine's 2xx answer, unparsed),
    ``stopped`` (the session may no longer send: nothing went out), ``status`` (the engine
    answered ``status``; ``excerpt``: the start of its body) or ``failed`` (no answer:
    ``message`` says why; it was aborted at the engine if it reached one). ``url``: the
    engine it went to, if any."""

    kind: OutcomeKind
    url: str | None = None
    body: bytes | memoryview = b""
    status: int = 0
    message: str = ""
    excerpt: str = ""

    def to_wire(self) -> list[Any]:
        """The outcome as msgpack-ready values (the body as bytes, not copied per byte)."""
        return [self.kind, self.url, self.body, self.status, self.message, self.excerpt]

    @classmethod
    def from_wire(cls, values: list[Any]) -> SendOutcome:
        """The outcome :meth:`to_wire` gave."""
        kind, url, body, status, message, excerpt = values
        return cls(kind, url, body, status, message, excerpt)

    def status_error(self, rid: str) -> EngineStatusError:
        """The engine's non-2xx answer of a ``status`` outcome, as the engine client
        raised it."""
        return EngineStatusError(
            self.message,
            status=self.status,
            body_excerpt=self.excerpt,
            url=self.url,
            request_id=rid,
        )


STOPPED = SendOutcome("stopped")


class Marks(Protocol):
    """What marks a recorded turn's weight spans: the send that took it
    (:meth:`RawSend.marked <miles_lite.rollout.send.Send.marked>`), or, in a worker
    process, nothing (the main process marks the record when it arrives)."""

    url: str | None

    def marked(self, spans: tuple[WeightSpan, ...], cached_tokens: int) -> tuple[WeightSpan, ...]:
        """``spans`` with the tokens made on KV from before an update marked."""
        ...


class TurnSender(Protocol):
    """How a forwarder gets a turn's payload to the engine: :class:`TurnSend` itself, or
    a worker's link to the main process that runs one."""

    async def send(
        self, session: SessionState, payload: dict[str, Any], rid: str
    ) -> tuple[SendOutcome, Marks]:
        """Send ``payload`` for ``session`` (see :meth:`TurnSend.send`)."""
        ...


class TurnSend:
    """The engine send of chat turns through ``router`` (see the module docstring), under
    ``config``'s engine and abort timeouts, counting aborts in ``counts``."""

    def __init__(
        self, router: Router, config: SessionServerConfig, counts: SessionCounters
    ) -> None:
        self._router = router
        self._config = config
        self._counts = counts

    async def send(
        self, session: SessionState, payload: dict[str, Any], rid: str
    ) -> tuple[SendOutcome, RawSend]:
        """Send ``payload`` (rid ``rid``) on ``session``'s engine through the one send
        path; the outcome, and the send (it marks the record's spans). Engine failures
        are outcomes, not raised (counted in the session's ``engine_errors``).
        Cancellation aborts the rid at its engine (shielded, bounded) and counts in
        ``disconnect_aborts``."""
        send = RawSend(
            self._router,
            session,
            CHAT_PATH,
            payload,
            rid,
            key=session.id,
            timeout_s=self._config.engine_timeout_s,
            abort_on_cancel=True,
            abort_timeout_s=self._config.abort_timeout_s,
        )
        session.send = send
        try:
            raw = await send.run()
        except EngineStatusError as exc:
            session.engine_errors += 1
            outcome = SendOutcome(
                "status", exc.url, status=exc.status, message=str(exc), excerpt=exc.body_excerpt
            )
            return outcome, send
        except EngineError as exc:
            session.engine_errors += 1
            if send.aborted == "failed":  # it reached the engine (a timeout, a reset)
                self._counts.timeout_aborts += 1
            return SendOutcome("failed", send.url, message=str(exc)), send
        finally:
            if send.aborted == "cancelled":  # the agent went away (or was cancelled)
                self._counts.disconnect_aborts += 1
        if raw is None:  # the run stopped while the turn waited for an engine slot
            return STOPPED, send
        return SendOutcome("ok", send.url, raw.body), send

    async def abort_turn(self, session: SessionState) -> None:
        """Abort the session's turn at its engine if one was sent. Best effort: the
        engine is gone or busy; the rollout's own abort repeats. A turn still waiting for
        a slot is not sent at all (its session is ``stopping``)."""
        send = session.send
        if send is not None and send.url is not None:
            await self._router.abort_request(
                send.url, send.rid, timeout_s=self._config.abort_timeout_s
            )
