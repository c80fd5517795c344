"""The agent-facing HTTP surface of the session server, one implementation for both modes:
in the rollout's process (:class:`~miles_lite.agentic.server.SessionServer` with
``processes=0``) and in each of its worker processes.

:class:`SessionApp` serves OpenAI chat and Anthropic Messages at the session URLs
(``/sessions/<id>/v1/...``, or ``/v1/...`` with the session's API key or an
``X-Session-Id`` header), ``/v1/models``, and a 404 that says what is served;
:func:`edge` is the middleware every request passes: the ``Host`` check of a loopback
server, and the answer (and count) of a :class:`~miles_lite.agentic.http_io.Refused`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from miles_lite.agentic.config import LOOPBACK_HOSTS, SessionCounters, SessionServerConfig
from miles_lite.agentic.forwarding import Forwarder
from miles_lite.agentic.http_io import (
    Refused,
    messages_refusal,
    read_chat_body,
    refuse,
    write_answer,
)
from miles_lite.agentic.messages_wire import chat_body, messages_answer, messages_events
from miles_lite.agentic.openai_wire import agent_answer
from miles_lite.agentic.registry import SessionRegistry, SessionState
from miles_lite.agentic.turns import BadTurn, merged_extra_body

__all__ = ["Recorded", "SessionApp", "edge"]

#: Called after a turn that added a record to its session (a worker sends it to the
#: rollout's process before the agent gets its answer).
Recorded = Callable[[SessionState], Awaitable[None]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[web.Request, SessionState, dict[str, Any]], Awaitable[web.StreamResponse]]


def edge(config: SessionServerConfig, counts: SessionCounters) -> Any:
    """The middleware of every request: the ``Host`` check on loopback, then the handler;
    a :class:`Refused` it raises is answered and counted in ``counts`` here."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            # A page in the user's browser can reach a loopback port through a name it
            # controls (DNS rebinding): a loopback server answers loopback names only.
            if config.loopback:
                host = (request.host or "").rsplit(":", 1)[0].strip("[]")
                if host not in LOOPBACK_HOSTS:
                    raise refuse(
                        403,
                        f"Host {request.host!r} is not served: this session server listens"
                        " on loopback and answers loopback names only",
                        "unauthorized",
                        "permission_error",
                    )
            return await handler(request)
        except Refused as refused:
            if refused.counter is not None:
                counts.count_refusal(refused.counter)
            return refused.response

    return middleware


class SessionApp:
    """The agents' routes over ``registry``'s sessions, each turn through ``forwarder``
    (see the module docstring). ``recorded``: called after a turn that recorded, before
    its answer is written (``None``: nothing to do, the records stay where they are)."""

    def __init__(
        self,
        config: SessionServerConfig,
        registry: SessionRegistry,
        forwarder: Forwarder,
        counts: SessionCounters,
        recorded: Recorded | None = None,
    ) -> None:
        self._config = config
        self._registry = registry
        self._forwarder = forwarder
        self._counts = counts
        self._recorded = recorded

    def add_routes(self, app: web.Application) -> None:
        """The agents' routes, and the 404 for everything else (add it last)."""
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._h_chat_path)
        app.router.add_get("/sessions/{sid}/v1/models", self._h_models_path)
        app.router.add_post("/v1/chat/completions", self._h_chat_key)
        app.router.add_post("/sessions/{sid}/v1/messages", self._h_messages_path)
        app.router.add_post("/v1/messages", self._h_messages_key)
        app.router.add_get("/v1/models", self._h_models_key)
        add_not_found(app)

    # -- handlers ----------------------------------------------------------------------------

    async def _h_models_path(self, request: web.Request) -> web.Response:
        self._registry.by_path(request)
        return self._models()

    async def _h_models_key(self, request: web.Request) -> web.Response:
        self._registry.by_key(request)
        return self._models()

    def _models(self) -> web.Response:
        model = {
            "id": self._config.model,
            "object": "model",
            "created": 0,
            "owned_by": "miles_lite",
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _h_chat_path(self, request: web.Request) -> web.StreamResponse:
        return await self._chat(request, self._registry.by_path(request), self._serve)

    async def _h_chat_key(self, request: web.Request) -> web.StreamResponse:
        return await self._chat(request, self._registry.by_key(request), self._serve)

    async def _h_messages_path(self, request: web.Request) -> web.StreamResponse:
        return await self._messages(request, lambda: self._registry.by_path(request))

    async def _h_messages_key(self, request: web.Request) -> web.StreamResponse:
        return await self._messages(request, lambda: self._registry.by_key(request))

    async def _messages(
        self, request: web.Request, find: Callable[[], SessionState]
    ) -> web.StreamResponse:
        """Anthropic Messages: every refusal in Messages' error shape."""
        try:
            return await self._chat(request, find(), self._serve_messages)
        except Refused as refused:
            raise Refused(messages_refusal(refused.response), refused.counter) from None

    async def _chat(
        self, request: web.Request, session: SessionState, serve: Serve
    ) -> web.StreamResponse:
        # The body first: a slow one must not hold the session busy (its real turn would
        # get a 409); it is bounded by body_timeout_s.
        config = self._config
        body = await read_chat_body(
            request, max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s
        )
        if session.busy:
            raise refuse(
                409,
                f"session {session.id} already has a chat request in flight; a session is one "
                "conversation: wait for the answer, or open another session for parallel work",
                "conflicts",
                "conflict_error",
            )
        session.busy = True
        session.last_used = time.monotonic()
        self._counts.requests += 1
        try:
            return await serve(request, session, body)
        finally:
            session.busy = False
            session.send = None
            session.last_used = time.monotonic()

    async def _turn(self, session: SessionState, body: dict[str, Any]) -> tuple[Any, bool]:
        """The forwarder's turn, then the ``recorded`` hook if it recorded."""
        before = len(session.records)
        answer, large = await self._forwarder.turn(session, body)
        if self._recorded is not None and len(session.records) > before:
            await self._recorded(session)
        return answer, large

    async def _serve(
        self, request: web.Request, session: SessionState, body: dict[str, Any]
    ) -> web.StreamResponse:
        try:
            body = merged_extra_body(body)
        except BadTurn as bad:
            raise refuse(400, bad.message, "refused", param=bad.param) from None
        stream = body.get("stream", False) is True
        answer, large = await self._turn(session, body)
        # What the agent asked for: the ids and log-probs the record needed stay out.
        trimmed = agent_answer(answer, body)
        # Encoded off the loop only when it still holds per-token log-prob entries.
        return await write_answer(request, trimmed, stream, large and body.get("logprobs") is True)

    async def _serve_messages(
        self, request: web.Request, session: SessionState, body: dict[str, Any]
    ) -> web.StreamResponse:
        try:
            chat = chat_body(body)
        except BadTurn as bad:
            raise refuse(400, bad.message, "refused", param=bad.param) from None
        answer, _ = await self._turn(session, chat)
        message = messages_answer(answer.parsed, model=self._model(body), stop=chat.get("stop"))
        if body.get("stream") is not True:
            return web.json_response(message)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in messages_events(message):
            await response.write(event)
        await response.write_eof()
        return response

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else self._config.model


def add_not_found(app: web.Application) -> None:
    """The 404 for every path not served, saying what is (add it last)."""
    app.router.add_route("*", "/{tail:.*}", _h_unknown)


async def _h_unknown(request: web.Request) -> web.Response:
    raise refuse(
        404,
        f"{request.method} {request.path} is not served here; a session serves "
        "POST .../v1/chat/completions, POST .../v1/messages and GET .../v1/models under "
        "/sessions/<id> (or /v1 with its API key), at the base URL open_session gave",
        "not_found",
        "not_found_error",
    )
