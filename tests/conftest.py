"""Shared fixtures: the anyio backend, a guard that fails any test blocking the loop, the
Qwen3 tokenizer, the SGLang captures; and the ``slow`` mark, given to every test that
starts processes or servers of its own (``python -m pytest -m "not slow"`` is the fast
tier)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from blockbuster import blockbuster_ctx

#: A callback or task step on the event loop that spends more CPU time than this fails the
#: test. CPU time of the loop's own thread, not wall time: on a loaded machine a step may
#: wait for a core, which is not the code's doing. Blocking calls are caught at any
#: duration by blockbuster; this catches CPU-bound stalls (tokenizing a long prompt on the
#: loop takes 0.4-0.7 s here, decoding a base64 body seconds).
LOOP_BLOCK_LIMIT_S = 0.3

#: Real SGLang 0.5.23 answers, copied into the repository so that any clone can test.
CAPTURES = Path(__file__).resolve().parent / "data" / "sglang_captures"


@pytest.fixture(scope="session", autouse=True)
def frozen_heap() -> Iterator[None]:
    """Move what the imports made (torch, transformers, aiohttp: ~280k objects) out of the
    collector's reach. A full collection of them takes ~0.25 s here; landing inside a loop
    step, it would trip the loop guard in whichever test happened to allocate then."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"debug": True})


#: Calls that are blocking in name only, by function and file: a write to the self-pipe
#: that wakes an executor's manager thread, and the line a dead executor's semaphore
#: finalizer (run by the garbage collector, anywhere) sends the resource tracker: a few
#: bytes into a pipe nobody else writes.
_CAN_BLOCK: dict[str, list[tuple[str, set[str]]]] = {
    "os.write": [
        ("concurrent/futures/process.py", {"wakeup", "__init__"}),
        ("multiprocessing/resource_tracker.py", {"_check_alive", "_send", "_write"}),
    ],
}


@pytest.fixture(autouse=True)
def fail_on_blocked_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if the library blocks the event loop.

    Two detectors, on any event loop (asyncio and uvloop alike):

    - blockbuster: any blocking call (file and socket I/O, ``time.sleep``, lock waits, ...)
      made by miles_lite code on the loop's thread raises ``BlockingError``, however short
      (asyncio and uvloop alike);
    - each step of asyncio's loop is timed in CPU time of the loop's thread: one over
      LOOP_BLOCK_LIMIT_S (a CPU-bound stall blockbuster cannot see) fails the test. uvloop
      runs its callbacks in C, out of reach: the same code is checked on asyncio.
    """
    if "anyio_backend" not in request.fixturenames:
        yield
        return
    with blockbuster_ctx(["miles_lite"]) as detector:
        for name, places in _CAN_BLOCK.items():
            for filename, functions in places:
                detector.functions[name].can_block_in(filename, functions)
        if request.node.get_closest_marker("slow_steps_ok") is not None:
            yield
            return
        yield from _slow_steps_fail()


class _CollectorTime:
    """CPU time the garbage collector spends on the thread that started it. A full
    collection lands in whichever step happens to allocate then, and its cost grows with
    everything earlier tests left on the heap (0.3-1 s late in a CI run): it is the
    interpreter's work, not the step's, so the loop guard subtracts it."""

    def __init__(self) -> None:
        self.spent: dict[int, float] = {}
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = time.thread_time()
        elif thread in self._started:
            elapsed = time.thread_time() - self._started.pop(thread)
            self.spent[thread] = self.spent.get(thread, 0.0) + elapsed

    def of_this_thread(self) -> float:
        return self.spent.get(threading.get_ident(), 0.0)


def _slow_steps_fail() -> Iterator[None]:
    records: list[str] = []
    original = asyncio.events.Handle._run
    collector = _CollectorTime()

    def _run(self: asyncio.events.Handle) -> None:
        # The step's own CPU time: what the code did, not what other processes took, nor
        # what the garbage collector took while the step happened to be running.
        start = time.thread_time()
        collected = collector.of_this_thread()
        try:
            original(self)
        finally:
            in_collector = collector.of_this_thread() - collected
            spent = time.thread_time() - start - in_collector
            if spent > LOOP_BLOCK_LIMIT_S:
                records.append(
                    f"{self!r} took {spent:.3f} s of CPU "
                    f"(and {in_collector:.3f} s in the garbage collector)"
                )

    gc.callbacks.append(collector)
    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    try:
        yield
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
        gc.callbacks.remove(collector)
    if records:
        pytest.fail("the event loop was blocked:\n" + "\n".join(records[:5]))


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template (from a package on the index: nothing
    is downloaded), loaded once."""
    from miles_lite.testing import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture
def captures() -> Path:
    """The folder of real SGLang captures (tests/data/sglang_captures)."""
    if not CAPTURES.is_dir():
        pytest.fail(f"captures not found at {CAPTURES}")
    return CAPTURES


def separate_tier(
    config: pytest.Config, items: list[pytest.Item], folder: Path, marker: str, timeout_s: float
) -> None:
    """Mark every test under ``folder`` with ``marker`` and a ``timeout_s`` limit; with no
    ``-m`` given, deselect them, so a plain run does not start what it was not asked for
    (a real server, another venv). A tier runs with ``pytest <folder> -m <marker>``."""
    mine = [i for i in items if folder in Path(str(i.path)).parents]
    for item in mine:
        item.add_marker(getattr(pytest.mark, marker))
        item.add_marker(pytest.mark.timeout(timeout_s))
    if not config.option.markexpr:
        keep = [i for i in items if i not in mine]
        if len(keep) != len(items):
            config.hook.pytest_deselected(items=mine)
            items[:] = keep


#: What starts processes (worker pools, child engines, clusters, CLIs, notebooks, real
#: servers, a journal's writer), as a test module's source names it: such a module's tests are ``slow``.
SLOW_SOURCE = re.compile(
    r"\b(subprocess|multiprocessing|ProcessPoolExecutor|open_process|ChildProcess"
    r"|\w*ProcessGroup|\w*EngineProcess|StandInProcess|RewardPool|ParserPool|WorkerPool|DaskRewardPool"
    r"|LocalCluster|parser_workers|reward_workers|fetch_in_parser|SGLangServer|SmgRouter"
    r"|run_notebook|cli_generate|pytester|Journal)\b"
    r"|\breward=[\"\w]"  # a rollout with a reward function starts a RewardPool
    r"|\bjournal=(?!None)"  # a journal starts its writer process
)
#: What a test function calls that starts processes, where its module's other tests do
#: not: the CLI in a child (tests/cli/conftest.py's ``cli``), the README's snippets (they
#: start reward pools).
SLOW_CALLS = re.compile(r"\b(cli|pointed)\(")
#: Fixtures (of the conftests) that start processes or pools of them.
SLOW_FIXTURES = frozenset(
    {
        "parser",
        "reward_pools",
        "cluster",
        "text_engine",
        "sglang_server",
        "sglang_url",
        "smg",
        "journaled",
    }
)
#: Tiers that start real servers (deselected unless asked for by their mark).
SLOW_TIERS = tuple(
    Path(__file__).resolve().parent / tier for tier in ("conformance", "chaos", "smg", "peer")
)
#: Folders whose every test starts engines that load weights and update them (the fleet's
#: fence and catch-up: 10-20 s a test on these machines).
SLOW_FOLDERS = (Path(__file__).resolve().parent / "fleet",)


def starts_processes(path: Path, cache: dict[Path, bool]) -> bool:
    """Whether the test module at ``path`` names what starts processes (cached)."""
    found = cache.get(path)
    if found is None:
        found = cache[path] = bool(SLOW_SOURCE.search(path.read_text()))
    return found


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that starts processes or servers: its module names what
    starts them (:data:`SLOW_SOURCE`), it uses a fixture that does (:data:`SLOW_FIXTURES`),
    or it belongs to a tier of real servers. ``-m "not slow"`` leaves them out."""
    cache: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.path))
        function = getattr(item, "function", None)
        if (
            starts_processes(path, cache)
            or (function is not None and SLOW_CALLS.search(inspect.getsource(function)))
            or set(getattr(item, "fixturenames", ())) & SLOW_FIXTURES
            or any(tier in path.parents for tier in (*SLOW_TIERS, *SLOW_FOLDERS))
        ):
            item.add_marker(pytest.mark.slow)
