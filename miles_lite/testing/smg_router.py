"""SGLang's router (``smg``) in a child process, in front of engines already running.

For the smg tier and the scale benchmark: :class:`SmgRouter` launches ``python -m smg
launch`` on free loopback ports with the given flags, waits until it lists every engine as
healthy, and kills it on exit. Its default flags are its own list (a stand-in shares none
of the library's code); the tier passes the library's
(:data:`miles_lite.engine.smg.SMG_FLAGS`), which is what users run. smg (the PyPI package
``smg``, a Rust binary behind a thin Python CLI) is not a dependency of miles_lite:
install it with ``pip install smg==1.13.0``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.testing.errors import StandInError
from miles_lite.testing.process import StartStop

__all__ = ["SmgRouter"]

#: Pause between two reads of the worker list while the router starts, in seconds.
_POLL_S = 0.05
#: Lines of the router log quoted in a start error.
_TAIL_LINES = 30
#: Flags for a router in front of stand-ins: what users run (:data:`SMG_FLAGS`, the one
#: source) with engines health-checked every second instead of two.
DEFAULT_FLAGS = (
    *SMG_FLAGS[: SMG_FLAGS.index("--health-check-interval-secs") + 1],
    "1",
    *SMG_FLAGS[SMG_FLAGS.index("--health-check-interval-secs") + 2 :],
)


class SmgRouter(StartStop):
    """smg over ``worker_urls`` (see the module docstring).

    Usage (sync or async)::

        with SmgRouter(engine_urls) as smg:
            ...  # a rollout opened on smg.url with RouterConfig(smg=SmgConfig())

    ``start()`` raises :class:`~miles_lite.testing.StandInError` when smg is not
    installed, exits while starting, or does not list every engine as healthy within
    ``start_timeout_s`` (quoting its log). ``stop()`` kills it (SIGTERM would keep it
    serving for a 5 s settle window; it holds nothing worth draining); idempotent, and run
    at interpreter exit if nobody called it. ``flags`` are the ``smg launch`` flags
    besides the addresses and the policy (default: :data:`DEFAULT_FLAGS`).
    """

    def __init__(
        self,
        worker_urls: Sequence[str],
        *,
        host: str = "127.0.0.1",
        policy: str = "consistent_hashing",
        flags: Sequence[str] = DEFAULT_FLAGS,
        start_timeout_s: float = 30.0,
    ) -> None:
        if isinstance(worker_urls, str) or not worker_urls:
            raise ValueError(f"SmgRouter worker_urls must be a list of URLs, got {worker_urls!r}")
        if isinstance(flags, str):
            raise ValueError(f"SmgRouter flags must be a sequence of arguments, got {flags!r}")
        self.worker_urls = list(worker_urls)
        self.host = host
        self.policy = policy
        self.flags = tuple(flags)
        self.start_timeout_s = float(start_timeout_s)
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_path: Path | None = None
        self._stopped = False
        self._finalizer: weakref.finalize[..., SmgRouter] | None = None

    @property
    def url(self) -> str:
        """``http://host:port``; raises StandInError when it is not running."""
        if self._port is None or self._stopped:
            raise StandInError("SmgRouter is not running")
        return f"http://{self.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The router's process id (None before start)."""
        return None if self._proc is None else self._proc.pid

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last ``lines`` lines of the router's log ('' when there is none)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes()[-32 * 1024 :].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def command(self, port: int, prometheus_port: int) -> list[str]:
        """The command line for ``port`` (and its metrics port)."""
        return [
            sys.executable,
            "-m",
            "smg",
            "launch",
            "--host",
            self.host,
            "--port",
            str(port),
            "--prometheus-port",
            str(prometheus_port),
            "--worker-urls",
            *self.worker_urls,
            "--policy",
            self.policy,
            *self.flags,
        ]

    def workers(self) -> list[dict[str, Any]]:
        """The router's ``GET /workers`` list (blocking HTTP)."""
        with urllib.request.urlopen(f"{self.url}/workers", timeout=5.0) as answer:
            workers: list[dict[str, Any]] = json.loads(answer.read())["workers"]
        return workers

    def start(self) -> None:
        """Launch the router and block until it lists every engine as healthy."""
        if self._stopped:
            raise StandInError("SmgRouter was stopped; make a new one")
        if self._proc is not None:
            return
        if importlib.util.find_spec("smg") is None:
            raise StandInError(f"smg is not installed in {sys.prefix}: pip install smg==1.13.0")
        port, metrics = _free_port(self.host), _free_port(self.host)
        fd, name = tempfile.mkstemp(prefix=f"smg-{port}-", suffix=".log")
        self._log_path = Path(name)
        with os.fdopen(fd, "wb") as log:
            self._proc = subprocess.Popen(
                self.command(port, metrics),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._port = port
        self._finalizer = weakref.finalize(self, _kill, self._proc)
        try:
            self._wait_listed()
        except BaseException:
            self.stop()
            raise

    def _wait_listed(self) -> None:
        proc = self._proc
        if proc is None:
            raise StandInError("SmgRouter._wait_listed() before start()")
        deadline = time.monotonic() + self.start_timeout_s
        want = set(self.worker_urls)
        while True:
            code = proc.poll()
            if code is not None:
                raise StandInError(
                    f"smg exited with code {code} while starting ({self.url}); log tail:\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError, KeyError):
                healthy = {w["url"] for w in self.workers() if w["is_healthy"]}
                if want <= healthy:
                    return
            if time.monotonic() >= deadline:
                raise StandInError(
                    f"smg at {self.url} did not list {sorted(want)} as healthy within"
                    f" {self.start_timeout_s} s; log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """Kill the router; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._proc is not None:
            _kill(self._proc)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
