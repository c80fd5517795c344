"""The session server's sessions: each one's state (:class:`SessionState`), and how a
request finds its session (:class:`SessionRegistry`): by the id in its URL, by its API key
(``Authorization: Bearer`` or Anthropic's ``x-api-key``), or by an ``X-Session-Id``
header, each refused with the answer that says what to send."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from miles_lite.agentic.config import Session
from miles_lite.agentic.http_io import bearer, refuse
from miles_lite.agentic.turns import Trajectory
from miles_lite.rollout.context import InFlight, RunContext
from miles_lite.rollout.send import RawSend
from miles_lite.sglang.chat_wire import TurnRecord

__all__ = ["SESSION_HEADER", "SessionRegistry", "SessionState"]

#: The header a harness may name its session in instead of the URL.
SESSION_HEADER = "X-Session-Id"


@dataclass
class SessionState:
    """One open session: its run, records, token-in trajectory, the turn in flight
    (``send``) and whether it may still send (:attr:`stopping`). With worker processes,
    ``sent`` is the send of the turn whose record is on its way from the worker (its KV
    marks are the send's to set)."""

    id: str
    key: str
    run: RunContext | None
    in_flight: InFlight
    last_used: float
    records: list[TurnRecord] = field(default_factory=list)
    trajectory: Trajectory | None = None
    busy: bool = False
    closed: bool = False
    aborted: bool = False
    send: RawSend | None = None
    sent: RawSend | None = None
    engine_errors: int = 0

    @property
    def stopping(self) -> bool:
        """Whether a turn may no longer be sent: the session was aborted or closed, or
        its run stopped (the send path checks it once the engine slot is taken)."""
        return self.aborted or self.closed or (self.run is not None and self.run.stopping)


class SessionRegistry:
    """The open sessions by id and by API key; ``loopback``: whether ids may pick a
    session (in the URL or the ``X-Session-Id`` header): only where no other host can
    reach the server."""

    def __init__(self, *, loopback: bool) -> None:
        self.loopback = loopback
        self.sessions: dict[str, SessionState] = {}
        self._by_key: dict[str, SessionState] = {}

    def open(self, run: RunContext | None) -> SessionState:
        """A new session (128 random bits of id, another 128 of API key) for ``run``."""
        return self.add(secrets.token_hex(16), f"sk-session-{secrets.token_hex(16)}", run)

    def add(self, sid: str, key: str, run: RunContext | None = None) -> SessionState:
        """The session ``sid`` with API key ``key`` (one the main process opened, in a
        worker process's registry)."""
        session = SessionState(
            id=sid,
            key=key,
            run=run,
            in_flight=run.in_flight if run is not None else InFlight(),
            last_used=time.monotonic(),
        )
        self.sessions[session.id] = session
        self._by_key[session.key] = session
        return session

    def idle(self, ttl_s: float) -> list[SessionState]:
        """The sessions no request touched in ``ttl_s`` and none is in flight on."""
        cutoff = time.monotonic() - ttl_s
        return [s for s in self.sessions.values() if s.last_used < cutoff and not s.busy]

    def drop(self, session: SessionState) -> None:
        """Forget ``session`` (it is closed)."""
        self.sessions.pop(session.id, None)
        self._by_key.pop(session.key, None)
        session.closed = True

    def clear(self) -> None:
        """Forget every session (each closed)."""
        for session in self.sessions.values():
            session.closed = True
        self.sessions.clear()
        self._by_key.clear()

    def public(self, session: SessionState, url: str) -> Session:
        """The handle an agent gets: its base URL (by id on loopback) and API key."""
        if not self.loopback:
            return Session(id=session.id, base_url=f"{url}/v1", api_key=session.key)
        return Session(
            id=session.id, base_url=f"{url}/sessions/{session.id}/v1", api_key=session.key
        )

    def by_id(self, sid: str) -> SessionState:
        """The open session ``sid``; a 404 :class:`Refused` otherwise."""
        session = self.sessions.get(sid)
        if session is None:
            raise refuse(
                404,
                f"session {sid!r} is unknown, expired or closed; open one with POST "
                "/sessions and use the base URL it returns",
                "not_found",
                "not_found_error",
            )
        return session

    def by_path(self, request: web.Request) -> SessionState:
        """The session named in the URL (``/sessions/<id>/...``), on loopback only."""
        self._ids_allowed("session URLs")
        return self.by_id(request.match_info["sid"])

    def by_key(self, request: web.Request) -> SessionState:
        """The session of the request's API key (``Authorization: Bearer`` or
        ``x-api-key``), or, on loopback, of its ``X-Session-Id`` header."""
        key = bearer(request) or request.headers.get("x-api-key", "").strip()
        if not key:
            named = request.headers.get(SESSION_HEADER, "").strip()
            if named:
                self._ids_allowed(f"session ids in the {SESSION_HEADER} header")
                return self.by_id(named)
            raise refuse(
                401,
                "no session key: send 'Authorization: Bearer <session api_key>' (or"
                f" x-api-key, or {SESSION_HEADER}: <session id>) from POST /sessions, or"
                " use the session's own base URL /sessions/<id>/v1",
                "unauthorized",
                "authentication_error",
            )
        session = self._by_key.get(key)
        if session is None:
            raise refuse(
                404,
                "the session of this API key is unknown, expired or closed; open a new one",
                "not_found",
                "not_found_error",
            )
        return session

    def _ids_allowed(self, what: str) -> None:
        if not self.loopback:
            raise refuse(
                401,
                f"{what} are off on a server other hosts can reach: use /v1 with "
                "Authorization: Bearer <session api_key>",
                "unauthorized",
                "authentication_error",
            )
