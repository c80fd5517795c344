"""Drive a real ipykernel through notebook cells from a (sync) pytest test.

Works with nbclient 0.11, nbformat 5.11, jupyter_client 8.10, jupyter_core 5.9,
ipykernel 7.4, IPython 9 (Python 3.11).

    with Notebook(notebook_or_sources, cwd=tmp_path) as nb:   # kernel up (~0.5 s)
        nb.run(0); nb.run(1)                              # CellExecutionError on error
        err = nb.interrupt(2, when="start", after=1.0)    # -> 'CancelledError' / 'KeyboardInterrupt'
        nb.run_source("DELAY = 0.1")                      # poke kernel state (not stored in nb)
        nb.run(2); nb.run(3)
        assert "ok" in nb.stdout(3)
                                                          # exit: kernel shut down (graceful ~0.1-0.3 s)

Everything runs on ONE private asyncio loop owned by this object (nbclient's async API),
in the calling thread; no second thread touches the zmq sockets.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook
from traitlets.config import Config

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PinnedKernelManager(AsyncKernelManager):
    """ipykernel running in *this* interpreter (sys.executable), whatever kernelspecs are
    installed (a user's ~/.local/share/jupyter/kernels/python3 or JUPYTER_PATH can point
    'python3' at another Python). With no kernel dirs, jupyter_client falls back to
    ipykernel's built-in spec, whose argv[0] is sys.executable."""

    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])


class Notebook:
    def __init__(
        self,
        sources: list[str] | NotebookNode,
        cwd: str | os.PathLike[str],
        cell_timeout: float = 60,
        env: dict[str, str] | None = None,
        shutdown: str = "graceful",
    ) -> None:
        cfg = Config()
        # CurveZMQ keys: no "Kernel is running over TCP without encryption" on kernel stderr.
        cfg.KernelManager.transport_encryption = "auto"
        self.client = NotebookClient(
            sources
            if isinstance(sources, NotebookNode)
            else new_notebook(cells=[new_code_cell(s) for s in sources]),
            kernel_name="python3",
            kernel_manager_class=PinnedKernelManager,
            config=cfg,
            timeout=None,  # our own per-cell timeout (see _run): nbclient's interrupt_on_timeout
            # re-sends SIGINT forever to a cell stuck in an await (ipykernel#881), and without it
            # the kernel stays busy after CellTimeoutError.
            startup_timeout=60,
            # plain tracebacks (IPython 9 colours them with ANSI codes by default)
            extra_arguments=["--InteractiveShell.colors=nocolor"],
            coalesce_streams=True,  # one stdout + one stderr output per cell, \r overwrites applied
            shutdown_kernel=shutdown,  # "graceful" (0.1-0.3 s; 2.5 s+ if it must SIGTERM) or "immediate"
            resources={"metadata": {"path": str(cwd)}},  # kernel cwd
        )
        self.cell_timeout = cell_timeout
        self._reply: dict[str, Any] | None = None
        self.client.on_cell_executed = self._on_cell_executed
        self._env = env
        self._loop = asyncio.new_event_loop()
        self._setup: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Notebook:
        kw = (
            {} if self._env is None else {"env": {**os.environ, **self._env}}
        )  # env REPLACES os.environ
        self._setup = self.client.async_setup_kernel(**kw)
        try:
            self._loop.run_until_complete(self._setup.__aenter__())
        except BaseException:
            self._loop.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        pgid = getattr(getattr(self.client.km, "provisioner", None), "pgid", None)
        try:
            self._loop.run_until_complete(self._setup.__aexit__(None, None, None))
        finally:
            # The kernel runs in its own session/process group (pgid == kernel pid). Anything a
            # cell started and did not stop (pool workers, fork server, resource tracker,
            # subprocesses) is in that group: make sure none of it outlives the test.
            # Give a resource tracker a moment to unlink what it tracks, then SIGKILL the rest.
            if pgid:
                deadline = time.monotonic() + 3.0
                try:
                    while time.monotonic() < deadline:
                        os.killpg(pgid, 0)  # ProcessLookupError once the group is empty
                        time.sleep(0.1)
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    @property
    def nb(self) -> NotebookNode:
        return self.client.nb

    @property
    def kernel_pid(self) -> int:
        return self.client.km.provisioner.pid  # type: ignore[union-attr]

    def _on_cell_executed(
        self, cell: NotebookNode, cell_index: int, execute_reply: dict[str, Any]
    ) -> None:
        self._reply = execute_reply

    # -- running -----------------------------------------------------------------------------
    def run(self, index: int, timeout: float | None = None) -> NotebookNode:
        """Execute cell ``index`` (again, if it ran before). Raises CellExecutionError
        (``.ename``/``.evalue``) if the cell raised; TimeoutError after ``timeout`` (default
        cell_timeout) seconds, once the cell has been interrupted and has ended."""
        return self._loop.run_until_complete(self._run(self.nb.cells[index], index, timeout))

    def run_source(self, source: str, timeout: float | None = None) -> NotebookNode:
        """Execute code in the kernel; the notebook is left as it was. (nbclient stores the
        executed cell back at ``nb.cells[index]``: an index of -1 would overwrite the last cell.)"""
        cells = self.nb.cells
        cells.append(new_code_cell(source))
        try:
            return self._loop.run_until_complete(self._run(cells[-1], len(cells) - 1, timeout))
        finally:
            cells.pop()

    async def _run(self, cell: NotebookNode, index: int, timeout: float | None) -> NotebookNode:
        timeout = self.cell_timeout if timeout is None else timeout
        self._reply = None
        task = asyncio.ensure_future(self.client.async_execute_cell(cell, index))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            name = await self._stop(task, grace=self.cell_timeout)
            raise TimeoutError(
                f"cell {index} ran past {timeout}s; interrupted ({name or 'finished'})"
            )
        result = task.result()  # raises CellExecutionError
        self._check_not_aborted(index)
        return result

    def _check_not_aborted(self, index: int) -> None:
        # An execute_request that reaches the kernel while it is still handling an error (e.g.
        # sent right after an interrupt) is *aborted*: no output, status 'aborted', and nbclient
        # does not raise. Make that loud.
        status = (self._reply or {}).get("content", {}).get("status")
        if status == "aborted":
            raise RuntimeError(
                f"cell {index} was aborted by the kernel (sent while it handled an error)"
            )

    async def _stop(self, task: asyncio.Future[Any], grace: float) -> str:
        """Interrupt the kernel and wait (bounded) until ``task``'s cell has ended."""
        deadline = time.monotonic() + grace
        if not task.done():  # never SIGINT an idle kernel: the signal also hits its pool workers
            await self.client.km.interrupt_kernel()  # type: ignore[union-attr]  # SIGINT to the kernel's process GROUP
        # ipykernel turns SIGINT during an awaiting cell into a call_soon() on its loop that
        # does not wake the loop (ipykernel#881): nothing happens until the loop wakes for
        # another reason (e.g. the cell's own 30 s sleep ends). Any shell request wakes it.
        while not task.done() and time.monotonic() < deadline:
            self.client.kc.kernel_info()  # type: ignore[union-attr]
            await asyncio.wait({task}, timeout=0.2)
        if not task.done():
            task.cancel()  # nbclient turns this into DeadKernelError("Kernel died")
        try:
            await task
        except CellExecutionError as e:
            return e.ename
        except BaseException:
            return "<still running>"
        return ""

    def interrupt(self, index: int, when: str = "", after: float = 1.0, timeout: float = 30) -> str:
        """Execute cell ``index``, interrupt it once its output contains ``when`` plus ``after``
        seconds, and return the error name it ended with ('CancelledError' for a cell awaiting
        on the loop, 'KeyboardInterrupt' for blocking sync code, '' if it finished anyway)."""
        return self._loop.run_until_complete(self._interrupt(index, when, after, timeout))

    async def _interrupt(self, index: int, when: str, after: float, timeout: float) -> str:
        cell = self.nb.cells[index]
        deadline = time.monotonic() + timeout
        self._reply = None
        task = asyncio.ensure_future(self.client.async_execute_cell(cell, index))
        while when and when not in text_of(cell) and not task.done():
            if time.monotonic() > deadline:
                await self._stop(task, grace=timeout)
                raise TimeoutError(f"{when!r} not in the output of cell {index}: {text_of(cell)!r}")
            await asyncio.sleep(0.05)
        await asyncio.wait({task}, timeout=after)
        name = await self._stop(task, grace=max(1.0, deadline - time.monotonic()))
        if name == "<still running>":
            raise TimeoutError(f"cell {index} still running {timeout}s after the interrupt")
        self._check_not_aborted(index)
        return name

    # -- reading outputs ---------------------------------------------------------------------
    def stdout(self, index: int) -> str:
        return _stream(self.nb.cells[index], "stdout")

    def stderr(self, index: int) -> str:
        return _stream(self.nb.cells[index], "stderr")

    def result(self, index: int) -> str | None:
        for o in self.nb.cells[index].outputs:
            if o.output_type == "execute_result":
                return o.data.get("text/plain")
        return None


def _stream(cell: NotebookNode, name: str) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


def text_of(cell: NotebookNode) -> str:
    """Everything a cell showed, as text (ANSI colours stripped from tracebacks)."""
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(o.data.get("text/plain", "") + "\n")
        elif o.output_type == "error":
            parts.append(ANSI.sub("", "\n".join(o.traceback)) + "\n")
    return "".join(parts)
