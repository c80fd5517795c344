"""The session server's worker processes, seen from the rollout's process: starting them,
placing sessions on them, answering what they ask (each turn's engine send, through the
one send path; each record as it is made), stopping them.

:class:`SessionWorkers` starts ``SessionServerConfig.worker_count`` processes (spawn: the
target is library code, so notebooks work; the user's ``__main__`` is not re-run) that
each connect to one Unix-domain socket in a private folder and serve the agents' HTTP
surface on a loopback port of their own (:mod:`miles_lite.agentic.worker_main`). A
session is placed on the worker with the fewest sessions.

A worker that dies is detected by its link closing: its in-flight sends are cancelled
(aborted at their engines), ``worker_exits`` counts it, the log says so with its exit
code, and a new worker takes its place; the agents of its sessions lose their
connection (their samples fail as any agent's failure does), the rollout goes on.
Leaving stops every worker: a ``stop`` notice, a bounded join, then terminate and kill.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from multiprocessing.process import BaseProcess
from typing import Any

import anyio
from anyio.abc import SocketListener, SocketStream, TaskGroup

from miles_lite._core.resources import AsyncResource
from miles_lite.agentic.config import SessionCounters, SessionServerConfig
from miles_lite.agentic.ipc import Link, unpack_record
from miles_lite.agentic.registry import SessionRegistry, SessionState
from miles_lite.agentic.turn_send import STOPPED, TurnSend
from miles_lite.agentic.worker_main import WorkerSettings, run_worker
from miles_lite.errors import WorkerCrashedError
from miles_lite.pools.worker_process import main_module_hidden

__all__ = ["SessionWorkers"]

_log = logging.getLogger(__name__)

#: Bound on a worker's exit after its ``stop`` notice, before it is terminated (seconds).
STOP_JOIN_S = 5.0


@dataclass(eq=False)
class _Worker:
    """One worker process: its link once it connected, its URL once it serves, its
    sessions and its last reported counters."""

    index: int
    process: BaseProcess
    ready: anyio.Event = field(default_factory=anyio.Event)
    link: Link | None = None
    url: str = ""
    sessions: set[str] = field(default_factory=set)
    counts: list[int] = field(default_factory=list)
    alive: bool = True


class SessionWorkers(AsyncResource):
    """The worker processes of a session server (see the module docstring). ``registry``
    holds the sessions (the main process's: runs, records, the turn in flight);
    ``sender`` sends their turns; ``counts`` counts the main process's part;
    ``dropped(session)`` is called for a session a worker closed after ``idle_ttl_s``."""

    _resource_name = "session workers"

    def __init__(
        self,
        config: SessionServerConfig,
        settings: WorkerSettings,
        registry: SessionRegistry,
        sender: TurnSend,
        counts: SessionCounters,
        dropped: Callable[[SessionState], None],
    ) -> None:
        super().__init__()
        self._config = config
        self._settings = settings
        self._registry = registry
        self._sender = sender
        self._counts = counts
        self._dropped = dropped
        self._workers: list[_Worker] = []
        self._gone: list[list[int]] = []
        self._where: dict[str, _Worker] = {}
        self._path = ""
        #: What a worker's ``ready`` notice must hold (spawn hands it over a private pipe).
        self._secret = secrets.token_hex(16)
        self._listener: SocketListener | None = None
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._indexes = itertools.count()
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def _open(self) -> None:
        stack = AsyncExitStack()
        self._stack = stack
        if sys.platform.startswith("linux"):
            # An abstract socket: no file to stat, create or remove (anyio stats a path
            # on the loop); a worker proves itself with the secret it was started with.
            self._path = f"\0miles-lite-sessions-{secrets.token_hex(16)}"
        else:
            folder = await anyio.to_thread.run_sync(_new_folder)
            stack.push_async_callback(anyio.to_thread.run_sync, _removed, folder)
            self._path = os.path.join(folder, "link.sock")
        self._listener = listener = await anyio.create_unix_listener(self._path)
        stack.push_async_callback(_quietly_closed, listener)
        self._tg = tg = await stack.enter_async_context(anyio.create_task_group())
        stack.push_async_callback(self._stop_all)
        tg.start_soon(self._accept, listener, tg)
        with anyio.fail_after(self._config.start_timeout_s):
            await self._start_workers(self._config.worker_count)

    async def _close(self) -> None:
        """Stop every worker (a ``stop`` notice, a bounded join, then terminate and
        kill), close the socket and remove its folder; shielded and bounded."""
        self._closing = True
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _start_workers(self, count: int) -> None:
        """Start ``count`` workers (one thread call: hiding ``__main__`` is not
        thread-safe) and wait until each serves."""
        context = multiprocessing.get_context("spawn")
        started = []
        for _ in range(count):
            index = next(self._indexes)
            process = context.Process(
                target=run_worker,
                args=(index, self._path, self._secret, os.getpid(), self._settings),
                name=f"miles-lite-session-worker-{index}",
                daemon=True,
            )
            started.append(_Worker(index, process))
        self._workers.extend(started)
        await anyio.to_thread.run_sync(_started, [w.process for w in started])
        for worker in started:
            await self._wait_ready(worker)

    async def _wait_ready(self, worker: _Worker) -> None:
        process = worker.process
        while not worker.ready.is_set():
            # A worker that dies while starting (an import error) never connects.
            with anyio.move_on_after(0.2):
                await worker.ready.wait()
            if not worker.ready.is_set() and not process.is_alive():
                self._workers.remove(worker)
                raise WorkerCrashedError(
                    f"session worker {worker.index} (pid {process.pid}) exited with code"
                    f" {process.exitcode} while starting; see its output above"
                )

    async def _accept(self, listener: SocketListener, tg: TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            tg.start_soon(self._serve_link, stream, tg)

    async def _serve_link(self, stream: SocketStream, tg: TaskGroup) -> None:
        link = Link(stream, "a session worker process")
        found: list[_Worker] = []

        def notices(kind: str, args: list[Any]) -> None:
            if kind == "ready":
                index, url, secret = args
                worker = next((w for w in self._workers if w.index == index), None)
                if worker is None or not secrets.compare_digest(secret, self._secret):
                    return
                worker.link, worker.url = link, url
                found.append(worker)
                worker.ready.set()
            elif found:
                self._notice(found[0], kind, args)

        async def requests(kind: str, args: list[Any]) -> Any:
            if not found:
                raise ValueError("a link that has not said it is ready asks nothing")
            return await self._requests(kind, args)

        try:
            await link.serve(requests, notices, tg)
        finally:
            await link.aclose()
        if found:
            await self._lost(found[0])

    async def _stop_all(self) -> None:
        with anyio.CancelScope(shield=True):
            for worker in self._workers:
                if worker.link is not None and worker.link.lost is None:
                    with anyio.move_on_after(1.0), _link_errors_ignored():
                        await worker.link.post("stop")
            for worker in list(self._workers):
                await anyio.to_thread.run_sync(_ended, worker.process)
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _lost(self, worker: _Worker) -> None:
        """A worker's link closed: if the server is not stopping, it died; replace it."""
        worker.alive = False
        if self._closing:
            return
        if worker in self._workers:
            self._workers.remove(worker)
        await anyio.to_thread.run_sync(_ended, worker.process)
        self._counts.worker_exits += 1
        _log.error(
            "session worker %d (pid %s) died (exit code %s): its %d session(s) lost their"
            " agents' connection; a new worker takes its place",
            worker.index,
            worker.process.pid,
            worker.process.exitcode,
            len(worker.sessions),
        )
        for sid in worker.sessions:
            self._where.pop(sid, None)
        if worker.counts:  # its last report stays counted
            self._gone.append(worker.counts)
        try:
            with anyio.fail_after(self._config.start_timeout_s):
                await self._start_workers(1)
        except (WorkerCrashedError, TimeoutError) as exc:
            _log.error("session worker could not be replaced: %s", exc)

    # -- sessions ----------------------------------------------------------------------------

    async def place(self, session: SessionState) -> str:
        """Put ``session`` on the worker with the fewest sessions; that worker's URL.
        Raises :class:`~miles_lite.errors.WorkerCrashedError` when no worker serves."""
        live = [(w, w.link) for w in self._workers if w.alive and w.link is not None]
        if not live:
            raise WorkerCrashedError(
                "no session worker process is serving (each died and could not be"
                " replaced; see the log): close this server and open a new one"
            )
        worker, link = min(live, key=lambda pair: len(pair[0].sessions))
        await link.call("open", session.id, session.key)
        worker.sessions.add(session.id)
        self._where[session.id] = worker
        return worker.url

    async def close(self, session_id: str) -> None:
        """Close the session on its worker (a later request there is a 404). Nothing
        when its worker died."""
        worker = self._where.pop(session_id, None)
        if worker is None:
            return
        worker.sessions.discard(session_id)
        if worker.alive and worker.link is not None:
            with _link_errors_ignored():
                await worker.link.call("close", session_id)

    def pids(self) -> list[int]:
        """The process ids of the workers serving now."""
        return [w.process.pid for w in self._workers if w.alive and w.process.pid is not None]

    def reported(self) -> list[list[int]]:
        """Each worker's last reported counters (the dead ones' too)."""
        return [*self._gone, *(w.counts for w in self._workers if w.counts)]

    async def collect(self) -> list[list[int]]:
        """Each live worker's counters now (a round trip to each)."""
        collected = list(self._gone)
        for worker in self._workers:
            if worker.alive and worker.link is not None:
                with _link_errors_ignored():
                    worker.counts = await worker.link.call("collect")
            if worker.counts:
                collected.append(worker.counts)
        return collected

    # -- what the workers ask ----------------------------------------------------------------

    async def _requests(self, kind: str, args: list[Any]) -> Any:
        if kind == "send":
            sid, rid, payload = args
            session = self._registry.sessions.get(sid)
            if session is None or session.stopping:
                return STOPPED.to_wire()
            try:
                outcome, send = await self._sender.send(session, payload, rid)
            finally:
                session.send = None
            if outcome.kind == "ok" and not session.closed:
                session.sent = send  # its record is the one to keep
            return outcome.to_wire()
        raise ValueError(f"the session server's main process does not answer {kind!r}")

    def _notice(self, worker: _Worker, kind: str, args: list[Any]) -> None:
        if kind == "record":
            self._record(*args)
        elif kind == "counts":
            (worker.counts,) = args
        elif kind == "expired":
            (sid,) = args
            worker.sessions.discard(sid)
            self._where.pop(sid, None)
            session = self._registry.sessions.get(sid)
            if session is not None:
                self._dropped(session)
        else:
            _log.warning("session server: unknown notice %r from worker %d", kind, worker.index)

    def _record(self, sid: str, packed: list[Any]) -> None:
        """A turn's record from its worker: marked by its send (KV from before an
        update), kept with its session's."""
        session = self._registry.sessions.get(sid)
        if session is None or session.sent is None:
            return  # closed before its send ended: not recorded, as in-process
        record = unpack_record(packed)
        sent, session.sent = session.sent, None
        if sent.rid != record.rid:
            return
        spans = sent.marked(record.weight_spans, record.cached_tokens)
        if spans is not record.weight_spans:
            record = replace(record, weight_spans=spans)
        session.records.append(record)


def _new_folder() -> str:
    """A private folder (mode 0700) for the link's socket: only this user connects."""
    return tempfile.mkdtemp(prefix="miles-lite-sessions-")


def _removed(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _started(processes: list[BaseProcess]) -> None:
    with main_module_hidden():
        for process in processes:
            process.start()


def _ended(process: BaseProcess) -> None:
    """Join ``process``: bounded, then terminate, then kill."""
    if process.pid is None:  # never started
        return
    process.join(STOP_JOIN_S)
    if process.is_alive():
        process.terminate()
        process.join(1.0)
    if process.is_alive():
        process.kill()
        process.join(1.0)


async def _quietly_closed(listener: SocketListener) -> None:
    with anyio.move_on_after(1.0, shield=True):
        await listener.aclose()


class _link_errors_ignored:
    """Suppress the errors of a link whose other end is gone (best-effort calls)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(
            kind,
            WorkerCrashedError | anyio.BrokenResourceError | anyio.ClosedResourceError | OSError,
        )
