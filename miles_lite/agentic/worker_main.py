"""What runs in a worker process of the session server (``SessionServerConfig.processes``):
the agents' HTTP surface (:class:`~miles_lite.agentic.session_app.SessionApp`, the same
as in-process) on a loopback port of its own, its sessions' token in, answer parsing and
recording; the engine sends are asked of the main process over the link
(:mod:`miles_lite.agentic.ipc`), each record sent there as it is made, before the agent
gets its answer.

:func:`run_worker` is the process's target (library code, so that spawn finds it from a
notebook or a script without a ``__main__`` guard). What the worker answers on its link:
``open`` / ``close`` a session (the main process opens and closes them; the worker keeps
their token-in state), ``collect`` (its counters now), the ``stop`` notice. What it asks
or tells: ``send`` (a turn's payload: the send's outcome), ``record`` (a packed
:class:`~miles_lite.sglang.chat_wire.TurnRecord`, sent before the agent's answer), ``expired`` (a session it closed
after ``idle_ttl_s``), ``counts`` (its counters, when they changed), ``ready`` (its
index, URL and the secret it was started with, once it serves: the main process trusts
no link before).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import anyio
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.agentic.config import SessionCounters, SessionServerConfig
from miles_lite.agentic.forwarding import Forwarder
from miles_lite.agentic.ipc import Link, pack_record
from miles_lite.agentic.registry import SessionRegistry, SessionState
from miles_lite.agentic.session_app import SessionApp, edge
from miles_lite.agentic.token_in import TokenIn
from miles_lite.agentic.turn_send import SendOutcome
from miles_lite.pools.worker_process import OWNER_POLL_S
from miles_lite.text.context import TokenizerThreads
from miles_lite.types import WeightSpan

__all__ = ["WorkerSettings", "run_worker"]

_log = logging.getLogger(__name__)

#: Seconds between two reports of a worker's counters (only when they changed).
COUNTS_EVERY_S = 0.2
#: The worker's young-generation threshold (CPython's default: 700). A turn's objects
#: (the answer's JSON values, the request's) are acyclic and freed by reference counting,
#: but their peaks crossed 700 every few turns, and each young collection walked what was
#: alive: text_layer.py's chat-aiohttp-procs@64 over an engine answering in SGLang's
#: shape, 4,096 turns: 629 collections, 213-413 ms of the worker's CPU (0.05-0.10 ms a
#: turn of its 0.7-0.8); at 10,000: one collection, the worker 0.54 ms a turn. Cycles
#: still go, at most 10,000 tracked objects later.
GC_YOUNG_THRESHOLD = 10_000


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What a worker process is started with (pickled by spawn): the server's ``config``,
    the rollout's ``tokenizer`` (token in), its ``sampling`` in chat names, the
    ``vocab_size`` answers are checked against, and ``tokenize_threads``."""

    config: SessionServerConfig
    tokenizer: Any
    sampling: dict[str, Any]
    vocab_size: int | None
    tokenize_threads: int


def run_worker(
    index: int, socket_path: str, secret: str, owner_pid: int, settings: WorkerSettings
) -> None:
    """The worker process: die with its owner, ignore SIGINT (the owner stops it), one
    thread for the math libraries; then serve until told to stop or the link closes."""
    # Not the pools' initializer: its parent-death signal fires when the *thread* that
    # started the process exits, and the server starts its workers from a worker thread
    # (a spawn writes the pickled tokenizer: it would block the loop) that anyio retires
    # when idle. The link closing (the owner gone) stops the worker; the watchdog covers
    # an owner whose socket outlives it.
    threading.Thread(target=_watch, args=(owner_pid,), name="owner-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    anyio.run(_serve, index, socket_path, secret, settings, backend="asyncio")


def _watch(owner_pid: int) -> None:
    """Exit once the owner is gone (this process was re-parented)."""
    while os.getppid() == owner_pid:
        time.sleep(OWNER_POLL_S)
    os._exit(1)


async def _serve(index: int, socket_path: str, secret: str, settings: WorkerSettings) -> None:
    stream = await anyio.connect_unix(socket_path)
    link = Link(stream, "the session server's main process")
    worker = _Worker(settings, link)
    app = web.Application(
        client_max_size=settings.config.max_body_bytes,
        middlewares=[edge(settings.config, worker.counts)],
    )
    worker.app.add_routes(app)
    runner, url = await serve_app(
        app, settings.config.host, 0, keepalive_timeout=settings.config.header_timeout_s
    )
    _quiet_collector()
    try:
        async with anyio.create_task_group() as tg:

            async def serve_link() -> None:
                await link.serve(worker.requests, worker.notices, tg)
                worker.stop.set()

            tg.start_soon(serve_link)
            tg.start_soon(worker.sweep_idle)
            tg.start_soon(worker.report_counts)
            await link.post("ready", index, url, secret)
            await worker.stop.wait()
            tg.cancel_scope.cancel()
    finally:
        with anyio.move_on_after(5.0, shield=True):
            await runner.cleanup()
        await link.aclose()


def _quiet_collector() -> None:
    """Once started: what the worker holds for good (its modules, tokenizer, app) out of
    the collector's sight (``gc.freeze``), and young collections only every
    :data:`GC_YOUNG_THRESHOLD` objects. This process is the library's own: the rollout's
    process keeps the collector its user set."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _collections() -> int:
    """Collections this process's collector ran, every generation."""
    return sum(generation["collections"] for generation in gc.get_stats())


class _Unmarked:
    """A worker's turn's :class:`~miles_lite.agentic.turn_send.Marks`: the engine's URL,
    spans as they are (the main process marks the record when it arrives)."""

    __slots__ = ("url",)

    def __init__(self, url: str | None) -> None:
        self.url = url

    def marked(self, spans: tuple[WeightSpan, ...], cached_tokens: int) -> tuple[WeightSpan, ...]:
        return spans


class _Worker:
    """A worker's sessions, counters, HTTP surface and link."""

    def __init__(self, settings: WorkerSettings, link: Link) -> None:
        config = settings.config
        self.config = config
        self.link = link
        self.stop = anyio.Event()
        self.counts = SessionCounters()
        self._collections_at_start = _collections()
        self.registry = SessionRegistry(loopback=config.loopback)
        # The worker sends no engine request itself (the main process does, through the
        # one send path): it has a tokenizer and its threads, and no router.
        threads = TokenizerThreads(settings.tokenizer, settings.tokenize_threads)
        token_in = TokenIn(threads, config, self.counts)
        forwarder = Forwarder(
            settings.vocab_size, config, settings.sampling, token_in, self.counts, self
        )
        self.app = SessionApp(config, self.registry, forwarder, self.counts, self._ship)

    # -- asked of the main process -----------------------------------------------------------

    async def send(
        self, session: SessionState, payload: dict[str, Any], rid: str
    ) -> tuple[SendOutcome, _Unmarked]:
        """The turn's send, run by the main process (a cancelled handler cancels it
        there: the rid is aborted at its engine)."""
        outcome = SendOutcome.from_wire(await self.link.call("send", session.id, rid, payload))
        return outcome, _Unmarked(outcome.url)

    async def _ship(self, session: SessionState) -> None:
        """Send the turn's record to the main process (it keeps the session's records)
        before the agent's answer is written; keep only the last one here (token in
        trims against its output). A notice: the link keeps frames in order, so the
        record is in before anything the worker answers after it (``close`` included)."""
        await self.link.post("record", session.id, pack_record(session.records[-1]))
        del session.records[:-1]
        await self.link.flushed()

    # -- answered to the main process --------------------------------------------------------

    async def requests(self, kind: str, args: list[Any]) -> Any:
        if kind == "open":
            sid, key = args
            self.registry.add(sid, key)
            return None
        if kind == "close":
            (sid,) = args
            session = self.registry.sessions.get(sid)
            if session is not None:
                self.registry.drop(session)
            return None
        if kind == "collect":
            return self._count_values()
        raise ValueError(f"a session worker does not answer {kind!r}")

    def notices(self, kind: str, args: list[Any]) -> None:
        if kind == "stop":
            self.stop.set()
        else:
            _log.warning("session worker: unknown notice %r from the main process", kind)

    def _count_values(self) -> list[int]:
        """The counts to report, with the collector's since the worker started."""
        self.counts.worker_gc_collections = _collections() - self._collections_at_start
        return self.counts.values()

    # -- background ---------------------------------------------------------------------------

    async def sweep_idle(self) -> None:
        ttl = self.config.idle_ttl_s
        while True:
            await anyio.sleep(min(ttl / 4, 30.0))
            for session in self.registry.idle(ttl):
                self.registry.drop(session)
                self.counts.expired += 1
                await self.link.post("expired", session.id)

    async def report_counts(self) -> None:
        reported: list[int] = []
        while True:
            await anyio.sleep(COUNTS_EVERY_S)
            values = self._count_values()
            if values != reported:
                await self.link.post("counts", values)
                reported = values
