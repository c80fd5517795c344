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
import functools
import importlib.util
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.testing.errors import StandInError
from miles_lite.testing.launcher import ServerProcess, free_port

__all__ = ["SmgRouter"]

#: Pause between two reads of the worker list while the router starts, in seconds.
_POLL_S = 0.05
#: Flags for a router in front of stand-ins: what users run (:data:`SMG_FLAGS`, the one
#: source) with engines health-checked every second instead of two.
DEFAULT_FLAGS = (
    *SMG_FLAGS[: SMG_FLAGS.index("--health-check-interval-secs") + 1],
    "1",
    *SMG_FLAGS[SMG_FLAGS.index("--health-check-interval-secs") + 2 :],
)


class SmgRouter(ServerProcess):
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

    tail_lines = 30

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
        super().__init__(name="smg", log_prefix="smg", host=host)
        self.worker_urls = list(worker_urls)
        self.host = host
        self.policy = policy
        self.flags = tuple(flags)
        self.start_timeout_s = float(start_timeout_s)

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
        if not self.check_startable():
            return
        if importlib.util.find_spec("smg") is None:
            raise StandInError(f"smg is not installed in {sys.prefix}: pip install smg==1.13.0")
        port = free_port(self.host)
        metrics = free_port(self.host, avoid={port})
        self.launch(self.command(port, metrics), port=port)
        try:
            self.wait_ready(self._listed, timeout_s=self.start_timeout_s, poll_s=_POLL_S)
        except BaseException:
            self.stop()
            raise

    def _listed(self) -> bool:
        healthy = {w["url"] for w in self.workers() if w["is_healthy"]}
        return set(self.worker_urls) <= healthy

    def not_ready_reason(self) -> str:
        return f"did not list {sorted(self.worker_urls)} as healthy"

    def reaper(self, proc: subprocess.Popen[bytes], *, at_exit: bool) -> Callable[[], None]:
        return functools.partial(_kill, proc)

    def after_stop(self) -> None:
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
