"""What runs inside a worker process of a :class:`~miles_lite.pools.worker_pool.WorkerPool`:
its initializer (die with the owner, one thread, nice), the start without the user's
``__main__``, and functions a worker cannot import sent by value."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["OWNER_POLL_S", "init_worker", "main_module_hidden", "ping", "portable"]

T = TypeVar("T")

#: Seconds between two checks that the pool's owner still lives.
OWNER_POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with(owner_pid: int) -> None:
    """Make this worker die with the process that owns its pool.

    The parent-death signal covers a worker whose parent is the owner (spawn) or the
    fork server (which exits when the owner does); the watchdog thread covers the rest
    (a fork server kept alive by something else). A worker that outlives its owner holds
    the arena and the owner's stdout, so ``$(python job.py)`` would never return.
    """
    if not sys.platform.startswith("linux") or owner_pid == os.getpid():
        return  # a thread executor runs in the owner itself
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the watchdog still covers it

    def watch() -> None:
        while True:
            time.sleep(OWNER_POLL_S)
            if not _alive(owner_pid):
                os._exit(1)

    threading.Thread(target=watch, name="miles-lite-owner-watch", daemon=True).start()
    if not _alive(owner_pid):
        os._exit(1)


def _alive(pid: int) -> bool:
    # A killed owner not yet reaped by its parent is a zombie: dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True


def init_worker(
    user_init: Callable[..., None] | None,
    nice: int,
    owner_pid: int,
    index: int,
    *args: Any,
) -> None:
    """A worker's initializer: die with the owner, ignore SIGINT, ``nice``, one thread,
    then the pool's own ``user_init(index, *args)``."""
    if owner_pid == os.getpid():
        # An in-process executor (threads): the settings below would change the owner.
        if user_init is not None:
            user_init(index, *args)
        return
    _die_with(owner_pid)
    # The owner decides when workers stop (aclose, or dying with it). An interrupt reaches
    # the whole process group (Ctrl-C; a notebook's interrupt signals the kernel's group):
    # an idle worker would die of it and leave a broken pool behind for the next cell.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The event loop is latency-bound, workers throughput-bound: under contention for the
    # cores, the loop's process is scheduled first.
    if nice:
        os.nice(nice)
    # One thread per worker: N workers on N cores, and no OpenMP pool to hang in.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    if user_init is not None:
        user_init(index, *args)


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start worker processes without re-running the user's ``__main__`` in them.

    spawn and forkserver re-import the parent's main script in every worker (and in the
    fork server): a script without an ``if __name__ == "__main__"`` guard would start a
    rollout in each worker, and one that imports torch makes every worker pay 1 s.
    Workers never need it: functions from ``__main__`` travel by value (cloudpickle).
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def ping() -> int:
    """This worker's pid (a call that returns once the worker has started)."""
    return os.getpid()


@functools.lru_cache(maxsize=64)
def _load_by_value(blob: bytes) -> Callable[..., Any]:
    import cloudpickle

    fn: Callable[..., Any] = cloudpickle.loads(blob)
    return fn


def _call_by_value(blob: bytes, *args: Any) -> Any:
    return _load_by_value(blob)(*args)


def portable(fn: Callable[..., T]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``fn`` itself if a worker can import it, else ``fn`` pickled by value.

    Functions from ``__main__`` (scripts, notebook cells), lambdas and closures cannot be
    imported by a worker; cloudpickle sends their code instead.
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    if module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        import cloudpickle

        return _call_by_value, (cloudpickle.dumps(fn),)
    return fn, ()
