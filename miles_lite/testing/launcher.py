"""One launcher for the servers the tiers run as child processes (SGLang, smg).

:class:`ServerProcess` owns what both repeated: a free loopback port (outside the
ephemeral range), a log file, a child in its own process group, a readiness poll that
quotes the log's tail when the child exits, cannot bind its port or does not become ready,
a stop that is idempotent and also runs at interpreter exit.
A subclass says what to run (``start()`` calls :meth:`ServerProcess.launch`), when it is
ready (:meth:`ServerProcess.wait_ready`), and how to end it (:meth:`ServerProcess.reaper`).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from miles_lite.testing.errors import StandInError
from miles_lite.testing.process import StartStop

__all__ = ["ServerProcess", "free_port"]


#: Where the kernel says its ephemeral ports (outgoing connections' source ports, and
#: what ``bind(host, 0)`` hands out) are (Linux).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port :func:`free_port` picks below that range.
_LOWEST_PORT = 10000
#: What a server's log says when its port was taken before it could bind it.
_PORT_TAKEN = "address already in use"


def free_port(host: str, *, avoid: Collection[int] = ()) -> int:
    """A port on ``host`` that nothing listens on right now and none of ``avoid``.

    Picked at random below the kernel's ephemeral range where it can be read: a server
    binds its port seconds after it is picked (SGLang: 10 s or more), and a port of that
    range can meanwhile become any outgoing connection's source port (the conformance
    tier lost a run to it: the server could not bind, and did not exit)."""
    low = _ephemeral_low()
    candidates = random.sample(range(_LOWEST_PORT, low), min(64, low - _LOWEST_PORT))
    for port in candidates:
        if port not in avoid and _bindable(host, port):
            return port
    while True:  # no readable range (not Linux), or every pick taken: the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def _ephemeral_low() -> int:
    """The first port of the ephemeral range (``_LOWEST_PORT`` when it cannot be read)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LOWEST_PORT
    return max(_LOWEST_PORT, low)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ServerProcess(StartStop):
    """A server child process in its own process group (see the module docstring).

    ``name`` names it in errors, ``log_prefix`` its log file (``/tmp/<prefix>-<port>-*.log``). ``url`` raises
    :class:`~miles_lite.testing.StandInError` before start and after stop; a stopped
    server cannot be started again.
    """

    #: Lines of the log quoted in a start error.
    tail_lines = 40

    def __init__(self, *, name: str, log_prefix: str, host: str) -> None:
        self._name = name
        self._log_prefix = log_prefix
        self._host = host
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_path: Path | None = None
        self._stopped = False
        self._finalizer: weakref.finalize[..., ServerProcess] | None = None

    @property
    def url(self) -> str:
        """``http://host:port``; raises StandInError when it is not running."""
        if self._port is None or self._stopped:
            raise StandInError(f"{self._name} is not running")
        return f"http://{self._host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The child's process id (None before start); also its process group's id."""
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> Path | None:
        """Where the child's stdout and stderr go."""
        return self._log_path

    def log_tail(self, lines: int | None = None) -> str:
        """The last ``lines`` lines of the log ('' when there is none)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with self._log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
        return "\n".join(data.splitlines()[-(lines or self.tail_lines) :])

    def check_startable(self) -> bool:
        """False when already started; raises StandInError when stopped."""
        if self._stopped:
            raise StandInError(f"{self._name} was stopped; make a new one")
        return self._proc is None

    def launch(
        self, command: Sequence[str], *, port: int, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` (serving on ``port``) in a new session, output to a log file."""
        fd, name = tempfile.mkstemp(prefix=f"{self._log_prefix}-{port}-", suffix=".log")
        self._log_path = Path(name)
        with os.fdopen(fd, "wb") as log:
            proc = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                # Its own process group: stop() and a test's signals reach the tree at once.
                start_new_session=True,
            )
        self._proc = proc
        self._port = port
        self._finalizer = weakref.finalize(self, self.reaper(proc, at_exit=True))
        return proc

    def wait_ready(self, ready: Callable[[], bool], *, timeout_s: float, poll_s: float) -> None:
        """Poll ``ready()`` until it is true; StandInError with the log tail when the child
        exits first, says its port is taken (address already in use) or ``timeout_s``
        passes. OSError and ValueError from ``ready`` mean not yet."""
        proc = self._proc
        if proc is None:
            raise StandInError(f"{self._name}.wait_ready() before launch()")
        deadline = time.monotonic() + timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                raise StandInError(
                    f"{self._name} exited with code {code} while starting ({self.url});"
                    f" log tail:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError, ValueError, KeyError):
                if ready():
                    return
            if _PORT_TAKEN in self.log_tail(5).lower():  # it will not serve, nor may exit
                raise StandInError(
                    f"{self._name} could not listen on {self.url}: the port was taken"
                    f" while it started; log tail:\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise StandInError(
                    f"{self._name} at {self.url} was not ready within {timeout_s} s"
                    f" ({self.not_ready_reason()}); log tail:\n{self.log_tail()}"
                )
            time.sleep(poll_s)

    def not_ready_reason(self) -> str:
        """What readiness waited for, for the timeout error."""
        return "not ready"

    def reaper(self, proc: subprocess.Popen[bytes], *, at_exit: bool) -> Callable[[], None]:
        """A function that ends ``proc`` and its tree; it must not hold ``self``."""
        raise NotImplementedError

    def after_stop(self) -> None:
        """Clean what the stopped child left (files, shared memory); default nothing."""

    def stop(self) -> None:
        """End the child and its tree; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._proc is not None:
            self.reaper(self._proc, at_exit=False)()
        self.after_stop()
