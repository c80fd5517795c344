"""The chat session server: OpenAI chat and Anthropic Messages at session-scoped URLs,
forwarded with TITO.

An agent speaks plain OpenAI chat to ``http://127.0.0.1:<port>/sessions/<id>/v1`` (or to
``/v1`` with ``Authorization: Bearer <session key>``, or with ``X-Session-Id: <id>`` on
loopback), or Anthropic Messages at ``.../v1/messages`` of the same URLs (the ``anthropic``
client's base URL is :attr:`Session.anthropic_base_url
<miles_lite.agentic.config.Session.anthropic_base_url>`; its ``x-api-key`` is the session
key): a Messages request is the chat request of the same exchange
(:mod:`miles_lite.agentic.messages_wire`). Each turn goes through the one send path
(:class:`~miles_lite.rollout.send.Send`) to the engine kept for the session, asking for the prompt ids,
output ids and log-probs, and each 2xx answer is recorded as a
:class:`~miles_lite.sglang.chat_wire.TurnRecord` from which
:mod:`miles_lite.agentic.assembly` builds training samples.

Token in, token out: after a session's first turn, the engine gets the trajectory's own
ids plus the tokens of the messages the agent appended (``input_ids``), so the model's
earlier output is never re-tokenized (a model's ``\\n\\n\\n`` is three tokens, the
tokenizer's spelling of it one). An agent that rewrites its history is templated anew:
its samples split there, counted.

The server does not trust its agents (:mod:`miles_lite.agentic.turns`): the rollout's
sampling wins, unknown keys are refused by name, slow clients are cut off, management
needs the server's own token, a loopback server refuses other ``Host`` names. A second
request on a session while one is in flight is refused (409); an agent that disconnects
or times out gets its rid aborted at the engine; early stop answers later requests at
once with ``abort``; idle sessions expire.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import Any

import anyio
from aiohttp import web

from miles_lite._core.resources import AsyncResource
from miles_lite._core.serve import serve_app
from miles_lite.agentic.config import (
    LOOPBACK_HOSTS,
    Session,
    SessionCounters,
    SessionServerConfig,
    SessionServerStatistics,
)
from miles_lite.agentic.forwarding import Forwarder
from miles_lite.agentic.http_io import (
    Refused,
    bearer,
    messages_refusal,
    read_chat_body,
    refuse,
    write_answer,
)
from miles_lite.agentic.messages_wire import chat_body, messages_answer, messages_events
from miles_lite.agentic.registry import SessionRegistry, SessionState
from miles_lite.agentic.token_in import TokenIn
from miles_lite.agentic.turns import BadTurn, merged_extra_body
from miles_lite.errors import SessionError
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.sglang.sampling import chat_sampling
from miles_lite.text.context import TextContext

__all__ = ["SessionServer"]

_log = logging.getLogger(__name__)

#: The chat endpoint of the engines.
CHAT_PATH = "/v1/chat/completions"
#: Engine answers larger than this are parsed in a worker thread, not on the event loop.
_OFF_LOOP_JSON_BYTES = 64 * 1024
#: Answers with more output tokens than this are encoded in a worker thread.
_OFF_LOOP_ANSWER_TOKENS = 1024


class SessionServer(AsyncResource):
    """OpenAI chat through session-scoped URLs (see the module docstring).

    ``context`` gives the router (sticky engine per session, its one retry loop), the
    rollout's sampling (applied to every turn), the tokenizer (token in) and the
    vocabulary the answers are checked against. An async resource: entering binds the
    port and starts the idle-session sweep; leaving (or :meth:`aclose`) stops serving,
    drops every session and waits for the handlers. ``management_token`` authorizes the
    HTTP session endpoints (``POST/GET/DELETE /sessions``); the library calls the
    methods directly. Use it from one event loop.

    Usage::

        async with SessionServer(context) as server:
            session = await server.open_session(run)
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key)
            ...
            records = await server.close_session(session.id)
    """

    _resource_name = "session server"

    def __init__(self, context: TextContext, config: SessionServerConfig | None = None) -> None:
        super().__init__()
        self._context = context
        self._router = context.router
        # In chat names; a key chat turns cannot carry refuses the server (and the
        # rollout opening it) here, never dropped turn by turn.
        self._sampling = chat_sampling(context.sampling_params())
        self._config = config or SessionServerConfig()
        #: Authorizes the HTTP session endpoints.
        self.management_token = secrets.token_urlsafe(32)
        self._registry = SessionRegistry(loopback=self._config.loopback)
        self._sessions = self._registry.sessions
        self._url = ""
        self._stack: AsyncExitStack | None = None
        self._counts = SessionCounters()
        self._token_in = TokenIn(context, self._config, self._counts)
        self._forwarder = Forwarder(
            context, self._config, self._sampling, self._token_in, self._counts
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def config(self) -> SessionServerConfig:
        """The server's settings."""
        return self._config

    @property
    def url(self) -> str:
        """``http://host:port`` once started."""
        self._check_open()
        return self._url

    @property
    def openai_base_url(self) -> str:
        """The fixed base URL (``.../v1``) where a session is picked by its API key."""
        return f"{self.url}/v1"

    async def _open(self) -> None:
        config = self._config
        app = web.Application(client_max_size=config.max_body_bytes, middlewares=[self._edge])
        app.router.add_post("/sessions", self._h_create)
        app.router.add_get("/sessions/{sid}", self._h_get)
        app.router.add_delete("/sessions/{sid}", self._h_delete)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._h_chat_path)
        app.router.add_get("/sessions/{sid}/v1/models", self._h_models_path)
        app.router.add_post("/v1/chat/completions", self._h_chat_key)
        app.router.add_post("/sessions/{sid}/v1/messages", self._h_messages_path)
        app.router.add_post("/v1/messages", self._h_messages_key)
        app.router.add_get("/v1/models", self._h_models_key)
        app.router.add_route("*", "/{tail:.*}", self._h_unknown)
        stack = AsyncExitStack()
        self._stack = stack
        # handler_cancellation: a handler whose agent disconnected is cancelled, so its
        # rid is aborted at the engine instead of generating for no one. keepalive_timeout
        # also closes a new connection whose headers do not arrive in time (slowloris).
        runner, self._url = await serve_app(
            app, config.host, config.port, keepalive_timeout=config.header_timeout_s
        )
        stack.push_async_callback(_cleanup, runner)
        task_group = await stack.enter_async_context(anyio.create_task_group())
        task_group.start_soon(self._sweep_idle)
        stack.callback(task_group.cancel_scope.cancel)
        if not config.loopback:
            _log.warning(
                "session server on %s: reachable from other hosts, so sessions are reached"
                " only with their API key (Authorization: Bearer <key> at %s/v1), never by URL",
                self._url,
                self._url,
            )

    async def _close(self) -> None:
        """Stop serving and drop every session (their records are lost); shielded and
        bounded (5 s)."""
        for session in self._sessions.values():
            self._router.forget(session.id)
        self._registry.clear()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _sweep_idle(self) -> None:
        ttl = self._config.idle_ttl_s
        while True:
            await anyio.sleep(min(ttl / 4, 30.0))
            cutoff = time.monotonic() - ttl
            for session in [s for s in self._sessions.values() if s.last_used < cutoff]:
                if not session.busy:
                    self._drop(session)
                    self._counts.expired += 1

    # -- library API -------------------------------------------------------------------------

    async def open_session(self, run: RunContext | None = None) -> Session:
        """Open a session (128 random bits of id, another 128 of API key) for ``run``:
        its turns count in the run's requests in flight, and once the run stops they are
        answered at once with ``finish_reason`` ``abort``."""
        self._check_open()
        session = self._registry.open(run)
        self._counts.opened += 1
        return self._registry.public(session, self._url)

    async def close_session(self, session_id: str) -> list[TurnRecord]:
        """Close a session and return its records, oldest first.

        A request still in flight on it is aborted at the engine and not recorded. Raises
        :class:`SessionError` for an unknown, expired or already closed session.
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(f"session {session_id!r} is unknown, expired or already closed")
        self._drop(session)
        self._counts.closed += 1
        await self._abort_turn(session)
        return list(session.records)

    def session_ids(self) -> list[str]:
        """The ids of the sessions open now, oldest first."""
        return list(self._sessions)

    def records(self, session_id: str) -> list[TurnRecord]:
        """A session's records so far; raises :class:`SessionError` if it is not open."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(f"session {session_id!r} is unknown, expired or already closed")
        return list(session.records)

    async def abort(self, session_ids: Iterable[str] | None = None) -> None:
        """Abort sessions (all open ones for ``None``): their in-flight engine requests are
        aborted (bounded by ``abort_timeout_s``), and every later request on them is
        answered at once with ``finish_reason`` ``abort``. Unknown ids are ignored."""
        ids = list(self._sessions) if session_ids is None else list(session_ids)
        targets = [self._sessions[i] for i in ids if i in self._sessions]
        for session in targets:
            session.aborted = True
        async with anyio.create_task_group() as tg:
            for session in targets:
                tg.start_soon(self._abort_turn, session)

    def statistics(self) -> SessionServerStatistics:
        """A snapshot of the server's counters."""
        return self._counts.snapshot(len(self._sessions))

    def _drop(self, session: SessionState) -> None:
        self._registry.drop(session)
        self._router.forget(session.id)

    # -- the edge ----------------------------------------------------------------------------

    @web.middleware
    async def _edge(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every request: the Host check, then the handler; a :class:`Refused` it raises
        is answered and counted here."""
        try:
            # A page in the user's browser can reach a loopback port through a name it
            # controls (DNS rebinding): a loopback server answers loopback names only.
            if self._config.loopback:
                host = (request.host or "").rsplit(":", 1)[0].strip("[]")
                if host not in LOOPBACK_HOSTS:
                    raise refuse(
                        403,
                        f"Host {request.host!r} is not served: this session server listens"
                        " on loopback and answers loopback names only",
                        "unauthorized",
                        "permission_error",
                    )
            response: web.StreamResponse = await handler(request)
        except Refused as refused:
            if refused.counter is not None:
                self._counts.count_refusal(refused.counter)
            return refused.response
        return response

    def _check_management(self, request: web.Request) -> None:
        if bearer(request) != self.management_token:
            raise refuse(
                401,
                "session management needs the server's management token "
                "(Authorization: Bearer <SessionServer.management_token>)",
                "unauthorized",
                "authentication_error",
            )

    # -- handlers ----------------------------------------------------------------------------

    async def _h_create(self, request: web.Request) -> web.Response:
        self._check_management(request)
        session = await self.open_session()
        return web.json_response(
            {"session_id": session.id, "base_url": session.base_url, "api_key": session.api_key}
        )

    async def _h_get(self, request: web.Request) -> web.Response:
        self._check_management(request)
        session = self._registry.by_id(request.match_info["sid"])
        records = [record.to_json() for record in session.records]
        return web.json_response(
            {
                "session_id": session.id,
                "records": records,
                "metadata": {"engine_errors": session.engine_errors},
            }
        )

    async def _h_delete(self, request: web.Request) -> web.Response:
        self._check_management(request)
        session = self._registry.by_id(request.match_info["sid"])
        await self.close_session(session.id)
        return web.Response(status=204)

    async def _h_models_path(self, request: web.Request) -> web.Response:
        self._registry.by_path(request)
        return self._models()

    async def _h_models_key(self, request: web.Request) -> web.Response:
        self._registry.by_key(request)
        return self._models()

    async def _h_unknown(self, request: web.Request) -> web.Response:
        raise refuse(
            404,
            f"{request.method} {request.path} is not served here; a session serves "
            "POST .../v1/chat/completions, POST .../v1/messages and GET .../v1/models under "
            "/sessions/<id> (or /v1 with its API key)",
            "not_found",
            "not_found_error",
        )

    def _models(self) -> web.Response:
        model = {
            "id": self._config.model,
            "object": "model",
            "created": 0,
            "owned_by": "miles_lite",
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _h_chat_path(self, request: web.Request) -> web.StreamResponse:
        return await self._chat(request, self._registry.by_path(request))

    async def _h_chat_key(self, request: web.Request) -> web.StreamResponse:
        return await self._chat(request, self._registry.by_key(request))

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
        self,
        request: web.Request,
        session: SessionState,
        serve: Callable[[web.Request, SessionState, dict[str, Any]], Awaitable[web.StreamResponse]]
        | None = None,
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
            return await (serve or self._serve)(request, session, body)
        finally:
            session.busy = False
            session.send = None
            session.last_used = time.monotonic()

    async def _serve(
        self, request: web.Request, session: SessionState, body: dict[str, Any]
    ) -> web.StreamResponse:
        try:
            body = merged_extra_body(body)
        except BadTurn as bad:
            raise refuse(400, bad.message, "refused", param=bad.param) from None
        stream = body.get("stream", False) is True
        answer, large = await self._forwarder.turn(session, body)
        # The engine's answer as it is: OpenAI clients ignore the extra fields, and agents
        # that read ids or meta_info can.
        return await write_answer(request, answer, stream, large)

    async def _serve_messages(
        self, request: web.Request, session: SessionState, body: dict[str, Any]
    ) -> web.StreamResponse:
        try:
            chat = chat_body(body)
        except BadTurn as bad:
            raise refuse(400, bad.message, "refused", param=bad.param) from None
        answer, _ = await self._forwarder.turn(session, chat)
        message = messages_answer(answer, model=self._model(body), stop=chat.get("stop"))
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

    async def _abort_turn(self, session: SessionState) -> None:
        await self._forwarder.abort_turn(session)


async def _cleanup(runner: web.AppRunner) -> None:
    with anyio.move_on_after(5.0, shield=True):
        await runner.cleanup()
