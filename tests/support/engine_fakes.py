"""Test-only engines on 127.0.0.1: a scripted aiohttp app, and a raw socket server for
broken answers.

Why these stay beside the other fakes (issue 34.7 weighed each):

- :class:`ScriptedEngine` answers any path with any bytes, status, content type, delay
  and framing (Content-Length in pieces, chunked), over real HTTP: what the aiohttp
  transport, the one error translator, the client and the router must survive from a
  broken or hostile engine (a None log-prob, a 503 storm, a body cut short, one
  connection reused). The text stand-in (:mod:`miles_lite.testing.text`) cannot: it
  answers only what SGLang would, checked against the captures; and
  :class:`~miles_lite.engine.http.mock.MockTransport` has no socket, so nothing of the
  HTTP framing or of aiohttp's errors is exercised through it.
- :class:`RawEngine` hands a bare socket to the test once the request is read: answers
  no HTTP server library would write (a body shorter than its Content-Length, then a
  close; a reset after the request arrived: "received, never re-sent").
"""

from __future__ import annotations

import asyncio
import socket
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from aiohttp import web

#: Seconds the test servers wait for open handlers when they stop (handlers here are short).
SHUTDOWN_TIMEOUT_S = 0.2


@dataclass(frozen=True)
class Reply:
    """One scripted answer: status, body, content type, a delay before answering, chunking."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/octet-stream"
    delay_s: float = 0.0
    #: Write the body in this many pieces (0: at once), with Content-Length unless ``chunked``.
    pieces: int = 0
    #: Send the body with chunked transfer encoding (no Content-Length).
    chunked: bool = False
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Seen:
    """A request as the server received it."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    #: The client's port: requests on one connection share it.
    client_port: int = 0


class ScriptedEngine:
    """An aiohttp app answering each path from a queue of replies, then from a default."""

    def __init__(self) -> None:
        self.url = ""
        self.seen: list[Seen] = []
        self.queues: dict[str, deque[Reply]] = defaultdict(deque)
        self.defaults: dict[str, Reply] = {"/health": Reply(200)}

    def script(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to ``path`` with ``replies``, in order."""
        self.queues[path].extend(replies)

    def count(self, path: str) -> int:
        """Requests received on ``path``."""
        return sum(1 for seen in self.seen if seen.path == path)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        port = peer[1] if peer else 0
        self.seen.append(Seen(request.method, request.path, body, dict(request.headers), port))
        queue = self.queues[request.path]
        reply = (
            queue.popleft() if queue else self.defaults.get(request.path, Reply(404, b"no route"))
        )
        if reply.delay_s:
            await anyio.sleep(reply.delay_s)
        if not reply.pieces and not reply.chunked:
            return web.Response(
                status=reply.status,
                body=reply.body,
                content_type=reply.content_type,
                headers=dict(reply.headers),
            )
        response = web.StreamResponse(status=reply.status, headers=dict(reply.headers))
        response.content_type = reply.content_type
        if reply.chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(reply.body)
        await response.prepare(request)
        step = -(-len(reply.body) // max(reply.pieces, 1))
        for start in range(0, len(reply.body), step):
            await response.write(memoryview(reply.body)[start : start + step])
        await response.write_eof()
        return response


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def start_engine(engine: ScriptedEngine) -> web.AppRunner:
    """Serve ``engine`` on a free port of 127.0.0.1 and set ``engine.url``."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    sock = listening_socket()
    await web.SockSite(runner, sock).start()
    engine.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    return runner


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawEngine:
    """A bare TCP server: ``answer`` gets the socket after the request head was read."""

    def __init__(self, answer: RawHandler) -> None:
        self.answer = answer
        self.connections = 0
        self.url = ""
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    await reader.readexactly(int(line.split(b":")[1]))
            await self.answer(reader, writer)
        finally:
            writer.close()
