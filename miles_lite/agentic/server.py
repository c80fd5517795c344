"""The chat session server: OpenAI chat at session-scoped URLs, forwarded with TITO.

An agent speaks plain OpenAI chat to ``http://127.0.0.1:<port>/sessions/<id>/v1`` (or to
``/v1`` with ``Authorization: Bearer <session key>``); each request goes to the engine the
router keeps for the session, asking for the prompt ids, output ids and log-probs, and each
2xx answer is recorded as a :class:`~miles_lite.sglang.chat_wire.TurnRecord` from which
:mod:`miles_lite.agentic.assembly` builds training samples.

Unlike miles: a second request on a session while one is in flight is refused (409)
instead of being served and silently not recorded; an agent that disconnects gets its rid
aborted at the engine; early stop answers later requests at once with ``abort``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiohttp import web

from miles_lite._core import json as _json
from miles_lite._core.resources import AsyncResource
from miles_lite._core.serve import serve_app
from miles_lite.agentic.config import Session, SessionServerConfig, SessionServerStatistics
from miles_lite.agentic.openai_wire import (
    abort_answer,
    as_chunk,
    error_response,
    passthrough,
    too_large,
)
from miles_lite.engine.router import Router
from miles_lite.errors import EngineError, EngineStatusError, SessionError
from miles_lite.rollout.context import InFlight, RunContext
from miles_lite.sglang.chat_wire import TurnRecord, record_from_choice
from miles_lite.sglang.generate_wire import new_rid
from miles_lite.sglang.sampling import CHAT_NAMES, TextSamplingParams

__all__ = ["Session", "SessionServer", "SessionServerConfig", "SessionServerStatistics"]

#: Bodies larger than this are parsed in a worker thread, not on the event loop.
_OFF_LOOP_JSON_BYTES = 64 * 1024
#: Answers with more output tokens than this are encoded in a worker thread.
_OFF_LOOP_ANSWER_TOKENS = 1024


#: The chat endpoint of the engines.
CHAT_PATH = "/v1/chat/completions"


@dataclass
class _Session:
    id: str
    key: str
    run: RunContext | None
    in_flight: InFlight
    records: list[TurnRecord] = field(default_factory=list)
    busy: bool = False
    closed: bool = False
    aborted: bool = False
    rid: str | None = None
    url: str | None = None
    engine_errors: int = 0


class _Reply(Exception):
    """An answer to the agent that ends request handling early (an error, an abort)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class SessionServer(AsyncResource):
    """OpenAI chat through session-scoped URLs, on loopback (see the module docstring).

    ``router`` sends each turn (one engine kept per session; its one retry loop);
    ``sampling`` is the rollout's sampling (applied to every turn). An async resource:
    entering binds the port, leaving (or :meth:`aclose`) stops serving, drops every
    session and waits for the handlers. Use it from one event loop.

    Usage::

        async with SessionServer(router, sampling) as server:
            session = await server.open_session(run)
            client = openai.AsyncOpenAI(base_url=session.base_url, api_key="-")
            ...
            records = await server.close_session(session.id)
    """

    _resource_name = "session server"

    def __init__(
        self,
        router: Router,
        sampling: TextSamplingParams | None = None,
        config: SessionServerConfig | None = None,
    ) -> None:
        super().__init__()
        self._router = router
        self._sampling = (sampling or TextSamplingParams()).to_payload()
        self._config = config or SessionServerConfig()
        self._sessions: dict[str, _Session] = {}
        self._by_key: dict[str, _Session] = {}
        self._runner: web.AppRunner | None = None
        self._url = ""
        self._counts = dict.fromkeys(
            (
                "opened",
                "closed",
                "requests",
                "recorded",
                "engine_errors",
                "conflicts",
                "not_found",
                "bad_requests",
                "too_large",
                "aborted_answers",
                "disconnect_aborts",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------------

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
        app = web.Application(client_max_size=self._config.max_body_bytes)
        app.router.add_post("/sessions", self._h_create)
        app.router.add_get("/sessions/{sid}", self._h_get)
        app.router.add_delete("/sessions/{sid}", self._h_delete)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._h_chat_path)
        app.router.add_get("/sessions/{sid}/v1/models", self._h_models_path)
        app.router.add_post("/v1/chat/completions", self._h_chat_key)
        app.router.add_get("/v1/models", self._h_models_key)
        app.router.add_route("*", "/{tail:.*}", self._h_unknown)
        # handler_cancellation: a handler whose agent disconnected is cancelled, so its
        # rid is aborted at the engine instead of generating for no one.
        self._runner, self._url = await serve_app(app, self._config.host, self._config.port)

    async def _close(self) -> None:
        """Stop serving and drop every session (their records are lost); shielded and
        bounded (5 s)."""
        runner, self._runner = self._runner, None
        for session in self._sessions.values():
            session.closed = True
            self._router.forget(session.id)
        self._sessions.clear()
        self._by_key.clear()
        if runner is not None:
            with anyio.move_on_after(5.0, shield=True):
                await runner.cleanup()

    # -- library API -------------------------------------------------------------------------

    async def open_session(self, run: RunContext | None = None) -> Session:
        """Open a session (128 random bits of id, another 128 of API key) for ``run``:
        its turns count in the run's requests in flight, and once the run stops, they are
        answered at once with ``finish_reason`` ``abort``."""
        self._check_open()
        session = _Session(
            id=secrets.token_hex(16),
            key=f"sk-session-{secrets.token_hex(16)}",
            run=run,
            in_flight=run.in_flight if run is not None else InFlight(),
        )
        self._sessions[session.id] = session
        self._by_key[session.key] = session
        self._counts["opened"] += 1
        return self._public(session)

    async def close_session(self, session_id: str) -> list[TurnRecord]:
        """Close a session and return its records, oldest first.

        A request still in flight on it is aborted at the engine and not recorded. Raises
        :class:`SessionError` for an unknown or already closed session.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionError(f"session {session_id!r} is unknown or already closed")
        self._by_key.pop(session.key, None)
        session.closed = True
        self._counts["closed"] += 1
        self._router.forget(session.id)
        if session.rid is not None and session.url is not None:
            await self._abort_rid(session.url, session.rid)
        return list(session.records)

    def session_ids(self) -> list[str]:
        """The ids of the sessions open now, oldest first."""
        return list(self._sessions)

    def records(self, session_id: str) -> list[TurnRecord]:
        """A session's records so far; raises :class:`SessionError` if it is not open."""
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(f"session {session_id!r} is unknown or already closed")
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
                if session.rid is not None and session.url is not None:
                    tg.start_soon(self._abort_rid, session.url, session.rid)

    def statistics(self) -> SessionServerStatistics:
        """A snapshot of the server's counters."""
        return SessionServerStatistics(open_sessions=len(self._sessions), **self._counts)

    def _public(self, session: _Session) -> Session:
        return Session(
            id=session.id, base_url=f"{self._url}/sessions/{session.id}/v1", api_key=session.key
        )

    # -- handlers ----------------------------------------------------------------------------

    async def _h_create(self, request: web.Request) -> web.Response:
        session = await self.open_session()
        return web.json_response(
            {"session_id": session.id, "base_url": session.base_url, "api_key": session.api_key}
        )

    async def _h_get(self, request: web.Request) -> web.Response:
        try:
            session = self._by_path(request)
        except _Reply as reply:
            return reply.response
        records = [record.to_json() for record in session.records]
        return web.json_response(
            {
                "session_id": session.id,
                "records": records,
                "metadata": {"engine_url": session.url, "engine_errors": session.engine_errors},
            }
        )

    async def _h_delete(self, request: web.Request) -> web.Response:
        try:
            session = self._by_path(request)
        except _Reply as reply:
            return reply.response
        await self.close_session(session.id)
        return web.Response(status=204)

    async def _h_models_path(self, request: web.Request) -> web.Response:
        try:
            self._by_path(request)
        except _Reply as reply:
            return reply.response
        return self._models()

    async def _h_models_key(self, request: web.Request) -> web.Response:
        try:
            self._by_key_header(request)
        except _Reply as reply:
            return reply.response
        return self._models()

    async def _h_unknown(self, request: web.Request) -> web.Response:
        self._counts["not_found"] += 1
        return error_response(
            404,
            f"{request.method} {request.path} is not served here; a session serves "
            "POST .../v1/chat/completions and GET .../v1/models under /sessions/<id> (or /v1 "
            "with its API key)",
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
        try:
            session = self._by_path(request)
        except _Reply as reply:
            return reply.response
        return await self._chat(request, session)

    async def _h_chat_key(self, request: web.Request) -> web.StreamResponse:
        try:
            session = self._by_key_header(request)
        except _Reply as reply:
            return reply.response
        return await self._chat(request, session)

    def _by_path(self, request: web.Request) -> _Session:
        sid = request.match_info["sid"]
        session = self._sessions.get(sid)
        if session is None:
            self._counts["not_found"] += 1
            raise _Reply(
                error_response(
                    404,
                    f"session {sid!r} is unknown or closed; open one with POST /sessions and "
                    "use the base URL it returns",
                    "not_found_error",
                )
            )
        return session

    def _by_key_header(self, request: web.Request) -> _Session:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            self._counts["not_found"] += 1
            raise _Reply(
                error_response(
                    401,
                    "no session key: send 'Authorization: Bearer <session api_key>' (from POST "
                    "/sessions), or use the session's own base URL /sessions/<id>/v1",
                    "authentication_error",
                )
            )
        session = self._by_key.get(key.strip())
        if session is None:
            self._counts["not_found"] += 1
            raise _Reply(
                error_response(
                    404,
                    "the session of this API key is unknown or closed; open a new session",
                    "not_found_error",
                )
            )
        return session

    async def _chat(self, request: web.Request, session: _Session) -> web.StreamResponse:
        if session.busy:
            self._counts["conflicts"] += 1
            return error_response(
                409,
                f"session {session.id} already has a chat request in flight; a session is one "
                "conversation: wait for the answer, or open another session for parallel work",
                "conflict_error",
            )
        session.busy = True
        self._counts["requests"] += 1
        try:
            return await self._serve(request, session)
        except _Reply as reply:
            return reply.response
        finally:
            session.busy = False
            session.rid = None

    async def _serve(self, request: web.Request, session: _Session) -> web.StreamResponse:
        body = await self._read_body(request)
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        if session.aborted or session.closed or (session.run is not None and session.run.stopping):
            self._counts["aborted_answers"] += 1
            answer = abort_answer(body.get("model") or self._config.model)
            return await self._answer(request, answer, stream)
        rid = new_rid()
        payload = self._payload(body, rid)
        forwarded = await self._forward(session, payload, rid)
        if forwarded is None:  # the run stopped while the turn waited for an engine slot
            self._counts["aborted_answers"] += 1
            answer = abort_answer(body.get("model") or self._config.model)
            return await self._answer(request, answer, stream)
        answer, url = forwarded
        try:
            record = record_from_choice(answer, rid=rid, engine_url=url, request=payload)
        except EngineError as exc:
            self._counts["engine_errors"] += 1
            session.engine_errors += 1
            raise _Reply(error_response(502, str(exc), "upstream_error")) from exc
        if not session.closed:
            session.records.append(record)
            self._counts["recorded"] += 1
        large = len(record.output_ids) > _OFF_LOOP_ANSWER_TOKENS
        # The engine's answer as it is: OpenAI clients ignore the extra fields, and
        # agents that read ids or meta_info can.
        return await self._answer(request, answer, stream, large)

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        limit = self._config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            self._counts["too_large"] += 1
            raise _Reply(too_large(request.content_length, limit))
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._counts["too_large"] += 1
            raise _Reply(too_large(None, limit)) from None
        try:
            if len(raw) > _OFF_LOOP_JSON_BYTES:
                body = await anyio.to_thread.run_sync(_json.loads, raw)
            else:
                body = _json.loads(raw)
        except ValueError as exc:
            self._counts["bad_requests"] += 1
            raise _Reply(
                error_response(
                    400, f"request body is not JSON ({exc}); send a chat.completions body"
                )
            ) from None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._counts["bad_requests"] += 1
            raise _Reply(
                error_response(
                    400,
                    "request body must be a JSON object with a 'messages' list",
                    param="messages",
                )
            )
        if not body["messages"]:
            self._counts["bad_requests"] += 1
            raise _Reply(
                error_response(
                    400, "'messages' is empty; send at least one message", param="messages"
                )
            )
        return body

    def _payload(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        payload = dict(body)
        # An agent may speak SGLang's names; the chat endpoint wants OpenAI's.
        if "max_new_tokens" in payload:
            payload.setdefault("max_tokens", payload.pop("max_new_tokens"))
        if "max_completion_tokens" in payload:
            payload.setdefault("max_tokens", payload["max_completion_tokens"])
        for key, value in self._sampling.items():
            name = CHAT_NAMES.get(key)
            if name is not None:
                payload.setdefault(name, value)
        # TITO: ids and log-probs of this turn only; logprob_start_len=0 would make the
        # engine compute prompt log-probs too (costly, and never used).
        payload.pop("logprob_start_len", None)
        payload.update(
            logprobs=True,
            return_prompt_token_ids=True,
            return_meta_info=True,
            rid=rid,
            stream=False,
        )
        return payload

    async def _forward(
        self, session: _Session, payload: dict[str, Any], rid: str
    ) -> tuple[Any, str] | None:
        """The engine's answer (parsed) and its URL; None when the run stopped before the
        turn was sent. Through the router's one retry loop, on the session's engine."""
        router = self._router
        client = router.client
        finished = False
        url = ""

        async def attempt(leased: str) -> Any:
            nonlocal url
            # Checked once the slot is taken: a turn still waiting at the stop is not sent.
            if session.run is not None and session.run.stopping:
                return None
            url = leased
            session.url, session.rid = leased, rid
            session.in_flight.sent_to(rid, leased)
            return await client.post(
                leased,
                CHAT_PATH,
                payload,
                request_id=rid,
                timeout_s=self._config.engine_timeout_s,
                retry=False,
            )

        try:
            with session.in_flight.track(rid):
                raw = await router.call(attempt, key=session.id)
            finished = True
            if raw is None:
                return None
        except EngineStatusError as exc:
            finished = True
            self._counts["engine_errors"] += 1
            session.engine_errors += 1
            raise _Reply(passthrough(exc)) from exc
        except EngineError as exc:
            finished = True
            self._counts["engine_errors"] += 1
            session.engine_errors += 1
            raise _Reply(error_response(502, f"engine failed: {exc}", "upstream_error")) from exc
        finally:
            if not finished and url:
                # The agent went away (or the request was cancelled): stop the generation.
                self._counts["disconnect_aborts"] += 1
                await self._abort_rid(url, rid)
        data = raw.body
        try:
            if len(data) > _OFF_LOOP_JSON_BYTES:
                return await anyio.to_thread.run_sync(_json.loads, data), url
            return _json.loads(data), url
        except ValueError as exc:
            self._counts["engine_errors"] += 1
            session.engine_errors += 1
            raise _Reply(
                error_response(
                    502, f"engine {url} answered non-JSON to rid {rid}", "upstream_error"
                )
            ) from exc

    async def _abort_rid(self, url: str, rid: str) -> None:
        # Best effort: the engine is gone or busy; the rollout's own abort repeats.
        await self._router.abort_request(url, rid, timeout_s=self._config.abort_timeout_s)

    async def _answer(
        self, request: web.Request, answer: dict[str, Any], stream: bool, large: bool = False
    ) -> web.StreamResponse:
        payload = as_chunk(answer) if stream else answer
        if large:
            # Thousands of per-token log-prob entries take tens of ms to encode.
            text = await anyio.to_thread.run_sync(lambda: _json.dumps(payload, strict=False))
        else:
            text = _json.dumps(payload, strict=False)
        if not stream:
            return web.Response(body=text, content_type="application/json")
        # The whole answer as one chunk, then [DONE] (as miles): ids and log-probs need the
        # complete answer, which SGLang does not stream.
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + text + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
