"""Child processes of the test harness: a stand-in engine served in a process of its own.

- :class:`StartStop`: sync and async context management over blocking ``start()`` and
  ``stop()`` (the child processes below, and :class:`~miles_lite.testing.SGLangServer`).
- :class:`ChildProcess`: runs ``factory(config)`` (an async context manager with a
  ``url``: a stand-in engine) in a child process, reports its URL, stops it. Generic
  over the engine's config type; the diffusion and text stand-ins' process classes are
  thin specialisations of it (:mod:`miles_lite.testing.diffusion.process`,
  :mod:`miles_lite.testing.text.process`).
- :class:`ProcessGroup`: several child processes started side by side.

Processes are started with ``spawn`` (or ``forkserver``), never ``fork``: a forked child
of a process that ran torch or aiohttp inherits its threads, sockets and epoll handle. Like
a worker pool's, the child never re-runs the parent's main script, so a script
without an ``if __name__ == "__main__":`` guard works too. The factory and the config
travel to the child by pickle: a class or function of an importable module (not
``__main__``), and a picklable config.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, suppress
from multiprocessing.connection import Connection
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from miles_lite.testing.errors import StandInError

if TYPE_CHECKING:
    from typing_extensions import Self
if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["START_METHODS", "ChildProcess", "ProcessGroup", "ServedEngine", "StartStop"]

#: The ways a child may be started (never ``fork``, see the module docstring).
START_METHODS = ("spawn", "forkserver")
#: Pause between two ``/health`` probes while an engine starts, in seconds.
_POLL_S = 0.05

ConfigT = TypeVar("ConfigT")
ChildT = TypeVar("ChildT", bound="ChildProcess[Any]")


class ServedEngine(Protocol):
    """What a child serves: an async context manager whose ``url`` is known once entered."""

    @property
    def url(self) -> str: ...


#: What :class:`ChildProcess` runs in the child: ``factory(config)``.
EngineFactory = Callable[[ConfigT], AbstractAsyncContextManager[ServedEngine]]


class StartStop:
    """Sync and async context management over blocking ``start()``/``stop()``.

    Both forms stop what a failed start left; the async form runs them in a worker thread
    and stops even when cancelled in start.
    """

    def start(self) -> None:
        """Start (blocking); a subclass defines it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop (blocking, idempotent); a subclass defines it."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        try:
            await anyio.to_thread.run_sync(self.start)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.stop)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)


class ChildProcess(StartStop, Generic[ConfigT]):
    """``factory(config)`` served in a child process (see the module docstring).

    Usage (sync or async)::

        with ChildProcess(StandInEngine, StandInConfig()) as child:
            ...  # POST f"{child.url}/rollout/generate"

    ``start()`` launches the child and returns once ``/health`` answers 200 (after any
    warm-up); it raises :class:`~miles_lite.testing.StandInError` if the child dies first
    or is not healthy after ``start_timeout_s`` seconds (the child is then stopped).
    ``stop()`` sends SIGTERM (the child closes its server), joins for ``stop_timeout_s``
    seconds, then kills; it is idempotent. The child also exits when this process dies
    (its pipe closes). ``start()`` and ``stop()`` block: the async context manager runs
    them in a worker thread, and stops the child even when cancelled during start. A
    stopped child cannot be restarted (:class:`~miles_lite.testing.StandInError`). Bad
    arguments raise :class:`ValueError`. ``kind`` names the child in messages.
    """

    def __init__(
        self,
        factory: EngineFactory[ConfigT],
        config: ConfigT,
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 5.0,
        start_method: str = "spawn",
        kind: str = "stand-in engine",
    ) -> None:
        owner = type(self).__name__
        if start_method not in START_METHODS:
            raise ValueError(
                f"{owner} start_method must be one of {START_METHODS}, got {start_method!r}"
            )
        for name, value in (
            ("start_timeout_s", start_timeout_s),
            ("stop_timeout_s", stop_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{owner} {name} must be a number > 0, got {value!r}")
        self.factory = factory
        self.config = config
        self.kind = kind
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
            raise RuntimeError(f"{type(self).__name__}.url is known once start() has returned")
        return self._url

    @property
    def pid(self) -> int | None:
        """The child's process id, None before ``start()``."""
        return None if self._process is None else int(self._process.pid)

    def is_alive(self) -> bool:
        """Whether the child process is running."""
        return self._process is not None and bool(self._process.is_alive())

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
            raise StandInError(f"{type(self).__name__} already {self._state}; create a new one")
        self._state = "started"
        parent, child = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child_main,
            args=(self.factory, self.config, child),
            name=f"miles-lite-{self.kind.replace(' ', '-')}",
            daemon=True,
        )
        self._conn = parent
        with _main_module_hidden():
            process.start()
        self._process = process
        child.close()

    def wait_ready(self, deadline: float) -> None:
        """Block until the child serves and ``/health`` is 200, or ``deadline``
        (``time.monotonic()`` seconds). Raises as :meth:`start` does."""
        conn, process = self._conn, self._process
        if conn is None or process is None:
            raise RuntimeError(f"{type(self).__name__}.wait_ready() before launch()")
        while self._url is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StandInError(
                    f"{self.kind} process {process.pid} did not start within"
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
            elif isinstance(message, _StartFailure):
                # The child said why before exiting: its exception's last line.
                process.join(self.stop_timeout_s)
                raise StandInError(
                    f"{self.kind} process {process.pid} exited with code {process.exitcode}"
                    f" before serving: {message.line}"
                )
            elif not process.is_alive():
                raise StandInError(
                    f"{self.kind} process {process.pid} exited with code {process.exitcode} "
                    "before serving (its stderr says why)"
                )
        while not _healthy(self._url):
            if not process.is_alive():
                raise StandInError(
                    f"{self.kind} process exited with code {process.exitcode} ({self._url})"
                )
            if time.monotonic() >= deadline:
                raise StandInError(
                    f"{self.kind} not healthy within {self.start_timeout_s} s ({self._url})"
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

    def signal_stop(self) -> None:
        """Send SIGTERM without waiting (:meth:`stop` then waits): a group signals all
        its children first, so that they shut down side by side."""
        if self._process is not None and self._process.is_alive():
            self._process.terminate()

    def call_json(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET ``path`` (or POST ``payload`` as JSON) on the child; its JSON answer
        (blocking HTTP). Raises urllib.error.HTTPError for an error status."""
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10.0) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result


class ProcessGroup(StartStop, Generic[ChildT]):
    """Several :class:`ChildProcess` started side by side (their start-ups overlap).

    Usage: ``with ProcessGroup([ChildProcess(...), ...]) as group: group.urls``. If one
    fails to start, all are stopped and its error is raised. Sync and async context
    manager, like :class:`ChildProcess`. ``processes`` must not be empty (ValueError).
    """

    def __init__(self, processes: Sequence[ChildT]) -> None:
        if not processes:
            raise ValueError(f"{type(self).__name__} needs at least one process, got none")
        self.processes: list[ChildT] = list(processes)

    @property
    def urls(self) -> list[str]:
        """The engines' URLs, in the order of the processes."""
        return [process.url for process in self.processes]

    def start(self) -> None:
        """Launch every child, then wait for each (blocking)."""
        try:
            for process in self.processes:
                process.launch()
            for process in self.processes:
                process.wait_ready(time.monotonic() + process.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every child (blocking); idempotent."""
        for process in self.processes:
            process.signal_stop()  # signal all first: they shut down side by side
        for process in self.processes:
            process.stop()


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a child without re-running the parent's ``__main__`` in it.

    spawn (and a fork server started now) would import the parent's main script in the
    child: a script without an ``if __name__ == "__main__":`` guard would start engines
    from inside its own child and end in multiprocessing's bootstrapping error. The child
    needs none of it: the factory and config come from importable modules.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class _StartFailure:
    """What a child that failed sends its parent before exiting: the exception's last line
    (``StandInError: the Qwen3 tokenizer files come from ...``), whitespace on one line."""

    def __init__(self, exc: BaseException) -> None:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # anyio's task groups wrap what they raise
        said = " ".join(str(exc).split())
        self.line = f"{type(exc).__qualname__}: {said}" if said else type(exc).__qualname__


def _child_main(factory: EngineFactory[Any], config: Any, conn: Connection) -> None:
    """Entry point of the child: serve until SIGTERM or until the parent goes away. An
    exception is sent to the parent in one line, then raised (its traceback on stderr)."""
    try:
        anyio.run(serve_in_child, factory, config, conn)
    except Exception as exc:
        # A parent that has gone or stopped reading (a failure after serving) does not
        # hide the exception itself.
        with suppress(OSError):
            conn.send(_StartFailure(exc))
        raise


async def serve_in_child(factory: EngineFactory[Any], config: Any, conn: Connection) -> None:
    """Run ``factory(config)`` (an async context manager with ``url``), send its URL to
    the parent, and serve until SIGTERM or until the parent goes away."""
    async with anyio.create_task_group() as tg:
        await tg.start(_exit_on_signal, tg.cancel_scope)
        async with factory(config) as engine:
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
    # SIGINT is ignored: an interrupt of the parent (Ctrl-C, a notebook's interrupt, which
    # signals the kernel's whole process group) must not take its engines away; the
    # parent stops them with SIGTERM, and they exit when it dies (the pipe closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return
