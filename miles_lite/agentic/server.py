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

Where the agents are served (``SessionServerConfig.processes``): in worker processes of
the server's own (``"auto"``, the default, or a count; :mod:`miles_lite.agentic.workers`),
each on its own loopback port, or in the rollout's own process and loop (``0``); both run
the same HTTP surface (:mod:`miles_lite.agentic.session_app`). The engine sends of both
modes run here, through the one send path (:mod:`miles_lite.agentic.turn_send`), and the
records are kept here. With workers, the server's own URL serves the management endpoints
only.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from contextlib import AsyncExitStack

import anyio
from aiohttp import web

from miles_lite._core.resources import AsyncResource
from miles_lite._core.serve import serve_app
from miles_lite.agentic.config import (
    Session,
    SessionCounters,
    SessionServerConfig,
    SessionServerStatistics,
)
from miles_lite.agentic.forwarding import Forwarder
from miles_lite.agentic.http_io import bearer, refuse
from miles_lite.agentic.registry import SessionRegistry, SessionState
from miles_lite.agentic.session_app import SessionApp, add_not_found, edge
from miles_lite.agentic.token_in import TokenIn
from miles_lite.agentic.turn_send import TurnSend
from miles_lite.agentic.worker_main import WorkerSettings
from miles_lite.agentic.workers import SessionWorkers
from miles_lite.errors import SessionError
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.startup import startup_step
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.sglang.sampling import chat_sampling
from miles_lite.text.context import TextContext

__all__ = ["SessionServer"]

_log = logging.getLogger(__name__)

#: Bound on a worker's confirmation that it closed a session (seconds).
_WORKER_CLOSE_S = 5.0


class SessionServer(AsyncResource):
    """OpenAI chat and Anthropic Messages through session-scoped URLs (see the module
    docstring).

    ``context`` gives the router (sticky engine per session, its one retry loop), the
    rollout's sampling (applied to every turn), the tokenizer (token in) and the
    vocabulary the answers are checked against. An async resource: entering binds the
    port, starts the worker processes (``config.processes``) and the idle-session sweep;
    leaving (or :meth:`aclose`) stops serving, stops the workers, drops every session and
    waits for the handlers. ``management_token`` authorizes the HTTP session endpoints
    (``POST/GET/DELETE /sessions``); the library calls the methods directly. Use it from
    one event loop.

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
        self._sender = TurnSend(self._router, self._config, self._counts)
        self._workers: SessionWorkers | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def config(self) -> SessionServerConfig:
        """The server's settings."""
        return self._config

    @property
    def url(self) -> str:
        """``http://host:port`` once started (with worker processes: the management
        endpoints only; each session's ``base_url`` names its worker)."""
        self._check_open()
        return self._url

    @property
    def openai_base_url(self) -> str:
        """The fixed base URL (``.../v1``) where a session is picked by its API key.
        Raises :class:`SessionError` with worker processes: each serves its own sessions
        at its own port (use :attr:`Session.base_url
        <miles_lite.agentic.config.Session.base_url>`)."""
        if self._config.worker_count:
            raise SessionError(
                "this session server serves agents in worker processes, each at its own"
                " port: use the session's base_url (open_session) instead of one /v1"
            )
        return f"{self.url}/v1"

    async def _open(self) -> None:
        config = self._config
        app = web.Application(
            client_max_size=config.max_body_bytes, middlewares=[edge(config, self._counts)]
        )
        app.router.add_post("/sessions", self._h_create)
        app.router.add_get("/sessions/{sid}", self._h_get)
        app.router.add_delete("/sessions/{sid}", self._h_delete)
        stack = AsyncExitStack()
        self._stack = stack
        if config.worker_count:
            add_not_found(app)
            workers = SessionWorkers(
                config,
                WorkerSettings(
                    config=config,
                    tokenizer=self._context.tokenizer,
                    sampling=self._sampling,
                    vocab_size=self._context.vocab_size,
                    tokenize_threads=self._context.tokenize_threads,
                ),
                self._registry,
                self._sender,
                self._counts,
                self._expired,
            )
            count = config.worker_count
            # Seconds on a loaded machine (each imports the library, unpickles the tokenizer).
            with startup_step(f"starting {count} session server worker process(es)"):
                self._workers = await stack.enter_async_context(workers)
        else:
            context = self._context
            token_in = TokenIn(context.threads, config, self._counts)
            forwarder = Forwarder(
                context.vocab_size, config, self._sampling, token_in, self._counts, self._sender
            )
            SessionApp(config, self._registry, forwarder, self._counts).add_routes(app)
        # handler_cancellation: a handler whose agent disconnected is cancelled, so its
        # rid is aborted at the engine instead of generating for no one. keepalive_timeout
        # also closes a new connection whose headers do not arrive in time (slowloris).
        runner, self._url = await serve_app(
            app, config.host, config.port, keepalive_timeout=config.header_timeout_s
        )
        stack.push_async_callback(_cleanup, runner)
        if not config.worker_count:
            task_group = await stack.enter_async_context(anyio.create_task_group())
            task_group.start_soon(self._sweep_idle)
            stack.callback(task_group.cancel_scope.cancel)
        if not config.loopback:
            _log.warning(
                "session server on %s: reachable from other hosts, so sessions are reached"
                " only with their API key (Authorization: Bearer <key> at the /v1 of their"
                " base_url), never by URL",
                self._url,
            )

    async def _close(self) -> None:
        """Stop serving, stop the worker processes and drop every session (their records
        are lost); shielded and bounded."""
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
            for session in self._registry.idle(ttl):
                self._drop(session)
                self._counts.expired += 1

    def _expired(self, session: SessionState) -> None:
        """A worker closed ``session`` after ``idle_ttl_s`` (and counted it)."""
        self._drop(session)

    # -- library API -------------------------------------------------------------------------

    async def open_session(self, run: RunContext | None = None) -> Session:
        """Open a session (128 random bits of id, another 128 of API key) for ``run``:
        its turns count in the run's requests in flight, and once the run stops they are
        answered at once with ``finish_reason`` ``abort``. With worker processes it is
        placed on the one with the fewest sessions (raises
        :class:`~miles_lite.errors.WorkerCrashedError` when none serves)."""
        self._check_open()
        session = self._registry.open(run)
        url = self._url
        if self._workers is not None:
            try:
                url = await self._workers.place(session)
            except BaseException:
                self._registry.drop(session)
                raise
        self._counts.opened += 1
        return self._registry.public(session, url)

    async def close_session(self, session_id: str) -> list[TurnRecord]:
        """Close a session and return its records, oldest first.

        A request still in flight on it is aborted at the engine and not recorded. Raises
        :class:`SessionError` for an unknown, expired or already closed session.
        """
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise SessionError(f"session {session_id!r} is unknown, expired or already closed")
        self._counts.closed += 1
        if self._workers is None:
            self._drop(session)
            await self._sender.abort_turn(session)
            return list(session.records)
        # Closed first (nothing more is sent or recorded), then closed on its worker: the
        # link keeps frames in order, so every record the worker sent before is in.
        session.closed = True
        with anyio.CancelScope(shield=True):
            await self._sender.abort_turn(session)
        with anyio.move_on_after(_WORKER_CLOSE_S, shield=True) as bound:
            await self._workers.close(session_id)
        if bound.cancelled_caught:
            _log.warning(
                "session %s: its worker did not confirm the close within %s s; a record it"
                " sent since may be missing",
                session_id,
                _WORKER_CLOSE_S,
            )
        self._drop(session)
        return list(session.records)

    def session_ids(self) -> list[str]:
        """The ids of the sessions open now, oldest first."""
        return list(self._sessions)

    def records(self, session_id: str) -> list[TurnRecord]:
        """A session's records so far (with worker processes: those that reached this
        process; a worker sends each before its agent's answer, and :meth:`close_session`
        returns every one); raises :class:`SessionError` if it is not open."""
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
                tg.start_soon(self._sender.abort_turn, session)

    def statistics(self) -> SessionServerStatistics:
        """A snapshot of the server's counters. With worker processes, their part is as
        of their last report (each reports within 0.2 s of a change); see
        :meth:`collect_statistics` for the counts now."""
        counts = self._counts
        if self._workers is not None:
            counts = counts.plus(*self._workers.reported())
        return counts.snapshot(len(self._sessions))

    async def collect_statistics(self) -> SessionServerStatistics:
        """The server's counters now: with worker processes, each is asked for its own
        (a round trip each); in-process, :meth:`statistics`."""
        self._check_open()
        counts = self._counts
        if self._workers is not None:
            counts = counts.plus(*await self._workers.collect())
        return counts.snapshot(len(self._sessions))

    def worker_pids(self) -> list[int]:
        """The process ids of the worker processes serving the agents now (none
        in-process): to watch them, or to see that none outlives the server."""
        return self._workers.pids() if self._workers is not None else []

    def _drop(self, session: SessionState) -> None:
        self._registry.drop(session)
        self._router.forget(session.id)

    # -- management endpoints ----------------------------------------------------------------

    def _check_management(self, request: web.Request) -> None:
        if bearer(request) != self.management_token:
            raise refuse(
                401,
                "session management needs the server's management token "
                "(Authorization: Bearer <SessionServer.management_token>)",
                "unauthorized",
                "authentication_error",
            )

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


async def _cleanup(runner: web.AppRunner) -> None:
    with anyio.move_on_after(5.0, shield=True):
        await runner.cleanup()
