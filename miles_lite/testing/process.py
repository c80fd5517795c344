"""Run stand-in engines in their own processes, so their CPU does not share the caller's loop.

Processes are started with ``spawn`` (or ``forkserver``), never ``fork``: a forked child
of a process that ran torch or aiohttp inherits its threads, sockets and epoll handle. As
with any spawned process, a script that starts one needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from miles_lite.testing._start_stop import StartStop
from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.engine import StandInEngine
from miles_lite.testing.errors import StandInError

__all__ = ["EngineProcess", "EngineProcessGroup"]

_START_METHODS = ("spawn", "forkserver")
#: Pause between two ``/health`` probes while an engine starts, in seconds.
_POLL_S = 0.05


class EngineProcess(StartStop):
    """A :class:`~miles_lite.testing.StandInEngine` in a child process.

    Usage (sync or async)::

        with EngineProcess(StandInConfig(step_latency_s=0.01)) as engine:
            ...  # POST f"{engine.url}/rollout/generate"
        async with EngineProcess() as engine:
            ...

    ``start()`` launches the child and returns once ``/health`` answers 200 (after any
    warm-up); it raises :class:`~miles_lite.testing.StandInError` if the child dies first
    or is not healthy after ``start_timeout_s`` seconds (the child is then stopped). ``stop()`` sends SIGTERM (the
    child closes its server), joins for ``stop_timeout_s`` seconds, then kills; it is
    idempotent. The child also exits when this process dies (its pipe closes). ``start()``
    and ``stop()`` block: the async context manager runs them in a worker thread, and
    stops the child even when cancelled during start. A stopped EngineProcess cannot be
    restarted (:class:`~miles_lite.testing.StandInError`). Bad arguments raise
    :class:`ValueError`.
    """

    def __init__(
        self,
        config: StandInConfig | None = None,
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 5.0,
        start_method: str = "spawn",
    ) -> None:
        if start_method not in _START_METHODS:
            raise ValueError(
                f"EngineProcess start_method must be one of {_START_METHODS}, got {start_method!r}"
            )
        for name, value in (
            ("start_timeout_s", start_timeout_s),
            ("stop_timeout_s", stop_timeout_s),
        ):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"EngineProcess {name} must be a number > 0, got {value!r}")
        self.config = config if config is not None else StandInConfig()
        self.start_timeout_s = float(start_timeout_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self._context: Any = multiprocessing.get_context(start_method)
        self._process: Any = None
        self._conn: Connection | None = None
        self._url: str | None = None
        self._state = "new"

    @property
    def url(self) -> str:
        """``http://host:port`` of the engine; RuntimeError before ``start()``."""
        if self._url is None:
            raise RuntimeError("EngineProcess.url is known once start() has returned")
        return self._url

    @property
    def pid(self) -> int | None:
        """The child's process id, None before ``start()``."""
        return None if self._process is None else self._process.pid

    def is_alive(self) -> bool:
        """Whether the child process is running."""
        return self._process is not None and self._process.is_alive()

    def start(self) -> None:
        """Launch the child and wait until it is healthy (blocking; see the class doc)."""
        self.launch()
        try:
            self.wait_ready(time.monotonic() + self.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def launch(self) -> None:
        """Start the child process without waiting for it (:meth:`wait_ready` waits)."""
        if self._state != "new":
            raise StandInError(f"EngineProcess already {self._state}; create a new one")
        self._state = "started"
        parent, child = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=self._child_target(),
            args=(self.config, child),
            name="miles-lite-stand-in-engine",
            daemon=True,
        )
        self._conn = parent
        self._process = process
        process.start()
        child.close()

    def _child_target(self) -> Any:
        """The child's entry point ``(config, conn)``: it serves ``config`` and sends its URL
        down ``conn``. A subclass that runs another engine (the text stand-in) replaces it."""
        return _child_main

    def wait_ready(self, deadline: float) -> None:
        """Block until the child serves and ``/health`` is 200, or ``deadline``
        (``time.monotonic()`` seconds). Raises as :meth:`start` does."""
        conn, process = self._conn, self._process
        if conn is None or process is None:
            raise RuntimeError("EngineProcess.wait_ready() before launch()")
        while self._url is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StandInError(
                    f"stand-in engine process {process.pid} did not start within"
                    f" {self.start_timeout_s} s"
                )
            try:
                ready = conn.poll(min(remaining, 0.2))
                message = conn.recv() if ready else None
            except (EOFError, OSError):
                message = None
                process.join(1.0)
            if isinstance(message, str):
                self._url = message
            elif not process.is_alive():
                raise StandInError(
                    f"stand-in engine process {process.pid} exited with code {process.exitcode} "
                    "before serving (its stderr says why)"
                )
        while not _healthy(self._url):
            if not process.is_alive():
                raise StandInError(
                    f"stand-in engine process exited with code {process.exitcode} ({self._url})"
                )
            if time.monotonic() >= deadline:
                raise StandInError(
                    f"stand-in engine not healthy within {self.start_timeout_s} s ({self._url})"
                )
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Terminate, join, kill if needed (blocking, bounded by ``2 * stop_timeout_s``)."""
        if self._state == "stopped":
            return
        self._state = "stopped"
        process, self._process = self._process, None
        if process is not None:
            if process.is_alive():
                process.terminate()
            process.join(self.stop_timeout_s)
            if process.is_alive():
                process.kill()
                process.join(self.stop_timeout_s)
            if not process.is_alive():
                process.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _signal_stop(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.terminate()

    def set_faults(self, **switches: Any) -> dict[str, Any]:
        """Set :class:`~miles_lite.testing.Faults` switches in the child (blocking HTTP).

        Returns the switches now in force. Raises urllib.error.HTTPError (400) for an
        unknown switch or a bad value. From async code, POST ``/_stand_in/faults`` instead.
        """
        return _call_json(f"{self.url}/_stand_in/faults", switches)

    def stats(self) -> dict[str, Any]:
        """The child's :class:`~miles_lite.testing.EngineStats` as JSON (blocking HTTP)."""
        return _call_json(f"{self.url}/_stand_in/stats", None)


class EngineProcessGroup(StartStop):
    """Several :class:`EngineProcess` started side by side (their start-ups overlap).

    Usage: ``with EngineProcessGroup([StandInConfig()] * 4) as group: group.urls``.
    If one fails to start, all are stopped and its error is raised. Sync and async
    context manager, like :class:`EngineProcess`; keyword arguments go to each.
    """

    def __init__(self, configs: Sequence[StandInConfig], **kwargs: Any) -> None:
        if not configs:
            raise ValueError(
                f"EngineProcessGroup configs must hold at least one StandInConfig, got {configs!r}"
            )
        self.processes = [EngineProcess(config, **kwargs) for config in configs]

    @property
    def urls(self) -> list[str]:
        """The engines' URLs, in the order of the configs."""
        return [process.url for process in self.processes]

    def start(self) -> None:
        """Launch every engine, then wait for each (blocking)."""
        try:
            for process in self.processes:
                process.launch()
            for process in self.processes:
                process.wait_ready(time.monotonic() + process.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every engine (blocking); idempotent."""
        for process in self.processes:
            process._signal_stop()  # signal all first: they shut down side by side
        for process in self.processes:
            process.stop()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _call_json(url: str, payload: dict[str, Any] | None) -> dict[str, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10.0) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


def _child_main(config: StandInConfig, conn: Connection) -> None:
    """Entry point of the child: serve until SIGTERM/SIGINT or until the parent goes away."""
    anyio.run(serve_in_child, StandInEngine, config, conn)


async def serve_in_child(make_engine: Callable[[Any], Any], config: Any, conn: Connection) -> None:
    """Run ``make_engine(config)`` (an async context manager with ``url``), send its URL to
    the parent, and serve until SIGTERM/SIGINT or until the parent goes away."""
    async with anyio.create_task_group() as tg:
        await tg.start(_exit_on_signal, tg.cancel_scope)
        async with make_engine(config) as engine:
            conn.send(engine.url)
            # The pipe reads EOF once the parent closes it or dies: no orphans.
            while True:
                await anyio.wait_readable(conn.fileno())
                try:
                    conn.recv()
                except (EOFError, OSError):
                    break
        tg.cancel_scope.cancel()


async def _exit_on_signal(
    scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return
