"""examples/quickstart.ipynb runs in a real Jupyter kernel (ipykernel, driven by nbclient):
every cell, then an interrupt in the middle of a rollout and the cell run again, with
nothing left behind (processes, shared-memory arenas and /dev/shm entries, listening
ports)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import psutil
import pytest
from nbclient.exceptions import CellExecutionError

from tests.support.leaks import leaked_shm, shm_entries
from tests.support.notebook import Notebook, text_of

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"

#: Cell indices in the notebook (markdown cells count).
SETUP, REWARD, TEXT, AGENT_DEF, AGENT, DIFFUSION, PICTURE, STOP = 1, 3, 5, 7, 8, 10, 12, 13


def untracked_outputs() -> set[str] | None:
    """Untracked files of the checkout that are not source (``.py``, ``.md``: what
    someone is writing in a shared tree), or None outside a git checkout."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if status.returncode != 0:
        return None
    paths = {line[3:] for line in status.stdout.splitlines() if line.startswith("?? ")}
    return {p for p in paths if not p.endswith((".py", ".md"))}


@pytest.fixture(autouse=True, scope="module")
def writes_nothing_into_the_checkout() -> Iterator[None]:
    """The notebook runs in a temporary folder: its picture and trace (and anything else
    a cell writes) never land in the repository."""
    before = untracked_outputs()
    yield
    if before is not None:
        assert untracked_outputs() - before == set()  # type: ignore[operator]


def _in_group(process: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.Error):
        return False


def kernel_group(pgid: int) -> set[int]:
    """Processes of the kernel's process group (its stand-ins, pool workers, the fork
    server), the kernel itself left out."""
    return {p.pid for p in psutil.process_iter(["pid"]) if p.pid != pgid and _in_group(p, pgid)}


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def arenas_of(pids: set[int]) -> int:
    """Shared-memory arenas (memfds) these processes map."""
    return sum(_maps(pid).count("memfd:miles_lite_arena") for pid in pids)


def listening_ports(pid: int) -> set[int]:
    return {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.mark.timeout(400)
def test_the_quickstart_notebook_runs_in_a_kernel_and_survives_an_interrupt(
    tmp_path: Path,
) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    shm_before = shm_entries()
    with Notebook(notebook, cwd=tmp_path, cell_timeout=180) as nb:
        kernel = nb.kernel_pid
        # The kernel works in tmp_path: the picture cell writes there.
        cwd = nb.run_source("import os\nprint(os.getcwd())").outputs[0].text.strip()
        assert Path(cwd) == tmp_path
        for index in (SETUP, REWARD, TEXT):
            nb.run(index)
        assert "engines ready: http://127.0.0.1:" in nb.stdout(SETUP)
        # Loading the tokenizer imports tqdm.auto (transformers): no widget warning either.
        assert "IProgress" not in text_of(nb.nb.cells[SETUP])
        # The start-up steps said what they did, and the progress bar needs no widgets.
        assert "starting reward pool 'boxed'" in nb.stderr(TEXT) and "done in" in nb.stderr(TEXT)
        assert "rollout: 100%" in nb.stderr(TEXT) and "IProgress" not in text_of(nb.nb.cells[TEXT])
        kept = re.search(r"kept (\d+) groups, dropped (\d+) .* (\d+) partial; resumed: kept (\d+)",
                         nb.stdout(TEXT))  # fmt: skip
        assert kept is not None, nb.stdout(TEXT)
        assert kept.group(1) == "3" and int(kept.group(2)) >= 1 and int(kept.group(3)) >= 1
        assert kept.group(4) == "3"
        baseline = kernel_group(kernel)  # stand-ins, fork server, resource tracker
        ports = listening_ports(kernel)  # the kernel's own (zmq)

        # A sync entry point inside the kernel's loop refuses at once (it would hang).
        started = time.monotonic()
        with pytest.raises(CellExecutionError) as caught:
            nb.run_source("from miles_lite import run_sync\nrun_sync(rollout.run, prompts)")
        assert caught.value.ename == "EventLoopError" and time.monotonic() - started < 30
        assert "use `await run(...)` here" in caught.value.evalue

        nb.run(AGENT_DEF)
        nb.run_source("AGENT_PROMPTS = 300")  # long enough to be interrupted mid-rollout
        ended = nb.interrupt(AGENT, when="rollout:", after=1.0, timeout=120)
        assert ended in ("CancelledError", "KeyboardInterrupt"), text_of(nb.nb.cells[AGENT])
        # The cell's `async with` closed the rollout: its pool, session server and sessions.
        assert kernel_group(kernel) == baseline
        assert listening_ports(kernel) == ports
        assert arenas_of(kernel_group(kernel) | {kernel}) == 0

        nb.run_source("AGENT_PROMPTS = 4")
        nb.run(AGENT)  # the same cell again, after the interrupt
        assert "8 samples, rewards [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]" in nb.stdout(AGENT)
        assert re.search(r"turns 2, \d+ response tokens", nb.stdout(AGENT))

        nb.run(DIFFUSION)
        rewards = nb.stdout(DIFFUSION).strip()
        assert rewards.startswith("[") and len(rewards.split(",")) == 4
        nb.run(PICTURE)
        assert (tmp_path / "quickstart.png").stat().st_size > 10_000
        assert (tmp_path / "quickstart.trace.json").stat().st_size > 0
        assert any("image/png" in o.get("data", {}) for o in nb.nb.cells[PICTURE].outputs)
        assert kernel_group(kernel) == baseline
        assert listening_ports(kernel) == ports
        # The samples' tensors view the closed rollout's arena until they are dropped.
        nb.run_source("del diffusion_result, rollout, pool\nimport gc\ngc.collect()")
        assert arenas_of(kernel_group(kernel) | {kernel}) == 0
        nb.run(STOP)
    assert leaked_shm(shm_before) == set()


def test_no_iprogress_warning_in_a_kernel_without_ipywidgets(tmp_path: Path) -> None:
    if importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed: tqdm.auto draws widgets and does not warn")
    cells = [
        "import miles_lite",
        # What transformers does as a tokenizer loads (huggingface_hub.utils.tqdm).
        "import tqdm.auto\nprint(tqdm.auto.tqdm.__module__)",
        "from miles_lite.rollout.progress import progress_bar\n"
        "bar = progress_bar(3)\nbar.update(3)\nbar.close()\nprint(type(bar).__module__)",
    ]
    with Notebook(cells, cwd=tmp_path) as nb:
        for index in range(len(cells)):
            nb.run(index)
        shown = "".join(text_of(cell) for cell in nb.nb.cells)
    assert "IProgress" not in shown and "Warning" not in shown, shown
    # The text bar (tqdm.auto over tqdm.asyncio), not the widget of tqdm.notebook.
    assert nb.stdout(1) == "tqdm.asyncio\n" and nb.stdout(2) == "tqdm.asyncio\n"
    assert "3/3" in nb.stderr(2)  # the text bar, left under the cell
