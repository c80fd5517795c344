"""Start and stop a real SGLang server on this CPU, for the conformance tier and by hand.

``scripts/sglang-cpu/setup.sh`` builds the server's own virtual environment (SGLang
0.5.23 on CPU torch, two shims, a tiny random-weight Qwen2 model with the real Qwen3
tokenizer). :class:`SGLangServer` launches ``sglang.launch_server`` from that venv on a
free loopback port, waits for ``/health``, and stops the server and every process it
spawned (scheduler, detokenizer) on exit, also when the caller fails or is interrupted.

By hand::

    python -m miles_lite.testing.sglang_server [--venv .sglang-venv] [--port 30000]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

from miles_lite.testing.errors import StandInError
from miles_lite.testing.launcher import ServerProcess, free_port

__all__ = [
    "SGLangServer",
    "SGLangServerConfig",
    "default_sglang_venv",
    "shm_leftovers",
    "shm_names",
]

#: Pause between two ``/health`` probes while the server starts, in seconds.
_POLL_S = 0.5
#: Lines of the server log quoted in a start error.
_TAIL_LINES = 40
#: The model folder setup.sh builds inside the venv.
_MODEL_DIR = "tiny-qwen2"


def default_sglang_venv() -> Path:
    """The venv setup.sh builds by default: ``$MILES_LITE_SGLANG_VENV`` or ``.sglang-venv``.

    ``.sglang-venv`` is looked up in the repository this module was imported from.
    """
    env = os.environ.get("MILES_LITE_SGLANG_VENV")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".sglang-venv"


@dataclass(frozen=True, kw_only=True)
class SGLangServerConfig:
    """How to launch the CPU SGLang server (the flags of WIRE.md section 6).

    ``venv``: the venv setup.sh built. ``model_path``: default ``venv/tiny-qwen2``.
    ``port``: 0 picks a free loopback port. ``start_timeout_s``: how long to wait for
    ``/health`` (startup takes 25-40 s on 2 cores). ``stop_timeout_s``: how long SIGTERM
    gets before SIGKILL. ``max_running_requests``/``max_total_tokens``: SGLang's limits
    (small, for a 2-core machine). ``extra_args``: more ``launch_server`` flags.
    """

    venv: Path = field(default_factory=default_sglang_venv)
    model_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    start_timeout_s: float = 240.0
    stop_timeout_s: float = 10.0
    max_running_requests: int = 8
    max_total_tokens: int = 4096
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.venv, Path):
            raise ValueError(f"SGLangServerConfig.venv must be a Path, got {self.venv!r}")
        if self.model_path is not None and not isinstance(self.model_path, Path):
            raise ValueError(
                f"SGLangServerConfig.model_path must be a Path or None, got {self.model_path!r}"
            )
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not (0 <= self.port <= 65535)
        ):
            raise ValueError(f"SGLangServerConfig.port must be in [0, 65535], got {self.port!r}")
        for name in ("start_timeout_s", "stop_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SGLangServerConfig.{name} must be > 0, got {value!r}")
        for name in ("max_running_requests", "max_total_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SGLangServerConfig.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.extra_args, tuple) or not all(
            isinstance(a, str) for a in self.extra_args
        ):
            raise ValueError(
                f"SGLangServerConfig.extra_args must be a tuple of str, got {self.extra_args!r}"
            )

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"

    @property
    def model(self) -> Path:
        """The model folder the server loads."""
        return self.model_path if self.model_path is not None else self.venv / _MODEL_DIR


class SGLangServer(ServerProcess):
    """A real SGLang server in its own process group.

    Usage (sync or async)::

        with SGLangServer() as server:
            ...  # POST f"{server.url}/generate"

    ``start()`` raises :class:`~miles_lite.testing.StandInError` when the venv or model
    is missing (naming setup.sh), when the server exits while starting, or when
    ``/health`` does not answer 200 within ``start_timeout_s``; the last two quote the
    tail of the server log. ``stop()`` sends
    SIGTERM to the whole process tree, waits ``stop_timeout_s``, then kills what is left;
    it is idempotent, and runs at interpreter exit if nobody called it. A stopped server
    cannot be restarted (:class:`~miles_lite.testing.StandInError`).
    """

    tail_lines = _TAIL_LINES

    def __init__(self, config: SGLangServerConfig | None = None) -> None:
        self._config = config if config is not None else SGLangServerConfig()
        super().__init__(name="SGLang server", log_prefix="sglang", host=self._config.host)
        #: SGLang's shared-memory segments that existed before this server started.
        self._shm_before: frozenset[str] = frozenset()

    @property
    def config(self) -> SGLangServerConfig:
        return self._config

    def command(self, port: int) -> list[str]:
        """The ``launch_server`` command line for ``port``."""
        c = self._config
        return [
            str(c.python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(c.model),
            "--device",
            "cpu",
            "--host",
            c.host,
            "--port",
            str(port),
            "--attention-backend",
            "torch_native",
            "--cuda-graph-backend-decode",
            "disabled",
            "--cuda-graph-backend-prefill",
            "disabled",
            "--grammar-backend",
            "none",
            "--max-total-tokens",
            str(c.max_total_tokens),
            "--max-running-requests",
            str(c.max_running_requests),
            "--mem-fraction-static",
            "0.05",
            "--dtype",
            "float32",
            # Without it the CPU scheduler spins a full core while idle (issue 33).
            "--sleep-on-idle",
            *c.extra_args,
        ]

    def start(self) -> None:
        """Launch the server and block until ``/health`` answers 200."""
        if not self.check_startable():
            return
        c = self._config
        if not c.python.exists():
            raise StandInError(
                f"no SGLang venv at {c.venv}: run scripts/sglang-cpu/setup.sh {c.venv}"
            )
        if not (c.model / "config.json").exists():
            raise StandInError(f"no model at {c.model}: run scripts/sglang-cpu/setup.sh {c.venv}")
        port = c.port or free_port(c.host)
        env = dict(os.environ)
        env.update(
            SGLANG_USE_CPU_ENGINE="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONUNBUFFERED="1",
            # Two cores are shared with the tests: a torch that spawns a thread per core
            # per process only contends with itself.
            OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        )
        # The server must not import this repo's packages or the caller's venv.
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        self._shm_before = shm_names()
        self.launch(self.command(port), port=port, env=env)
        try:
            self.wait_ready(self._healthy, timeout_s=c.start_timeout_s, poll_s=_POLL_S)
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=5.0) as resp:
            return bool(resp.status == 200)

    def not_ready_reason(self) -> str:
        return "did not answer /health"

    def reaper(self, proc: subprocess.Popen[bytes], *, at_exit: bool) -> Callable[[], None]:
        timeout_s = 0.0 if at_exit else self._config.stop_timeout_s
        return functools.partial(_kill_tree, proc.pid, timeout_s)

    def after_stop(self) -> None:
        # Remove what the server left in shared memory (see shm_leftovers).
        if self._proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        for name in shm_leftovers(self._shm_before):
            with contextlib.suppress(OSError):
                (_SHM / name).unlink()


#: Where POSIX shared memory lives on Linux, and the prefixes of what a server may leave
#: there: SGLang's segments, and multiprocessing's named semaphores.
_SHM = Path("/dev/shm")
_LEFTOVER_PREFIXES = ("sglang_", "sem.mp-")


def shm_names() -> frozenset[str]:
    """The names in ``/dev/shm`` a server may leave behind (see :func:`shm_leftovers`)."""
    try:
        return frozenset(p.name for p in _SHM.iterdir() if p.name.startswith(_LEFTOVER_PREFIXES))
    except OSError:  # no /dev/shm (not Linux)
        return frozenset()


def shm_leftovers(before: frozenset[str]) -> list[str]:
    """The names of :func:`shm_names` that are not in ``before`` and that no live process
    maps: what servers that ran since left behind. SGLang leaves its load-reporting segment
    even when stopped cleanly; and when its process group is SIGKILLed (a crash, or the
    chaos tier's kill), the resource tracker that would unlink its multiprocessing
    semaphores dies with it. A name some process still maps is in use (another server's
    segment, a pool's semaphore) and is never listed."""
    new = shm_names() - before
    if not new:
        return []
    mapped = _mapped_shm_inodes()
    left = []
    for name in sorted(new):
        try:
            inode = (_SHM / name).stat().st_ino
        except OSError:  # gone meanwhile
            continue
        if inode not in mapped:
            left.append(name)
    return left


def _mapped_shm_inodes() -> set[int]:
    """The inodes of the ``/dev/shm`` files a live process maps (``/proc/*/maps``: by
    inode, since a semaphore is mapped under the temporary name glibc made it with)."""
    inodes: set[int] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        for line in text.splitlines():
            if f" {_SHM}/" in line:
                fields = line.split(maxsplit=5)
                with contextlib.suppress(IndexError, ValueError):
                    inodes.add(int(fields[4]))
    return inodes


def _kill_tree(pid: int, timeout_s: float) -> None:
    """SIGTERM the server, then SIGKILL every process of its tree that outlives it.

    Descendants are collected first: SGLang's scheduler and detokenizer are multiprocessing
    children that would be re-parented (and lost) once the parent exits. Only the parent
    gets SIGTERM: it stops its children itself, whereas a child killed first makes it wait
    5 s for crash diagnostics.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    if procs and timeout_s > 0:
        with contextlib.suppress(psutil.NoSuchProcess):
            root.terminate()
        psutil.wait_procs(procs, timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    alive = [p for p in procs if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5.0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m miles_lite.testing.sglang_server",
        description="Run the CPU SGLang server built by scripts/sglang-cpu/setup.sh until Ctrl-C.",
    )
    parser.add_argument("--venv", type=Path, default=default_sglang_venv())
    parser.add_argument("--model-path", type=Path, default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    config = SGLangServerConfig(
        venv=args.venv,
        model_path=args.model_path,
        port=args.port,
        start_timeout_s=args.start_timeout,
    )
    server = SGLangServer(config)
    # SIGTERM (a supervisor, `kill`, CI's timeout) ends the process the way Ctrl-C does,
    # through the `with` below, so the server it started goes with it (was left orphaned).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    try:
        with server:
            print(
                f"SGLang ready at {server.url} in {time.monotonic() - t0:.1f} s "
                f"(log: {server.log_path}); Ctrl-C stops it",
                flush=True,
            )
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except StandInError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    raise SystemExit(main())
