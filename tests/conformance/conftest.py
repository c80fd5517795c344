"""The conformance tier: tests against a real SGLang 0.5.23 server on this CPU.

Run with ``python -m pytest tests/conformance -m conformance -p no:cacheprovider`` after
``scripts/sglang-cpu/setup.sh`` (venv: ``$MILES_LITE_SGLANG_VENV`` or ``.sglang-venv``).
A plain ``python -m pytest`` deselects the tier: it needs the venv and a minute of startup.
Every test here fails, never skips, when the venv is missing or the server does not start.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from miles_lite.testing import SGLangServer, SGLangServerConfig, default_sglang_venv
from miles_lite.testing.sglang_server import shm_leftovers, shm_names
from tests.conftest import separate_tier

HERE = Path(__file__).resolve().parent
#: Per-test limit in this tier (the default 120 s would cut a slow server start).
TEST_TIMEOUT_S = 420


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance: needs the real CPU SGLang server (scripts/sglang-cpu/setup.sh)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The first test also waits for the server to start: 40-60 s alone on 2 cores, more
    # when the machine is busy.
    separate_tier(config, items, HERE, "conformance", TEST_TIMEOUT_S)
    for item in items:
        if HERE in Path(str(item.path)).parents:
            # Blockbuster still fails any blocking call by miles_lite on the loop, but not
            # the slow-step check: a real SGLang server (its idle scheduler alone takes
            # ~0.6 core) shares the 2 cores, so a loop step can wait a second for a core
            # without the library doing anything wrong.
            item.add_marker(pytest.mark.slow_steps_ok)


@pytest.fixture(scope="session")
def sglang_venv() -> Path:
    venv = default_sglang_venv()
    if not (venv / "bin" / "python").exists():
        pytest.fail(f"no SGLang venv at {venv}: run scripts/sglang-cpu/setup.sh first")
    return venv


@pytest.fixture(scope="session")
def sglang_python(sglang_venv: Path) -> Path:
    return sglang_venv / "bin" / "python"


@pytest.fixture(scope="session")
def sglang_site(sglang_python: Path) -> Path:
    """The sglang venv's site-packages."""
    out = subprocess.run(
        [str(sglang_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def api_types(sglang_site: Path) -> ModuleType:
    """SGLang's generated /generate contract, loaded by file path from the installed wheel."""
    path = sglang_site / "sglang" / "api" / "v1" / "api_types.py"
    if not path.exists():
        pytest.fail(f"{path} is missing: the sglang wheel in the venv is not 0.5.23")
    spec = importlib.util.spec_from_file_location("_sglang_api_types", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # msgspec resolves the Struct annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sglang_server(sglang_venv: Path) -> Iterator[SGLangServer]:
    """One real server for the whole tier, stopped with all its children at the end, and
    with them the shared memory it made (SGLang leaves a load-reporting segment)."""
    before = shm_names()
    server = SGLangServer(SGLangServerConfig(venv=sglang_venv, start_timeout_s=TEST_TIMEOUT_S - 60))
    try:
        server.start()
    except Exception as exc:
        pytest.fail(f"the SGLang server did not start: {exc}")
    try:
        yield server
    finally:
        server.stop()
    left = shm_leftovers(before)
    assert not left, f"the stopped server left shared memory behind: {left}"


@pytest.fixture(scope="session")
def sglang_url(request: pytest.FixtureRequest) -> str:
    """The server's URL; ``$MILES_LITE_SGLANG_URL`` points the tier at one already running
    (by hand: ``python -m miles_lite.testing.sglang_server --port 30000``)."""
    url = os.environ.get("MILES_LITE_SGLANG_URL")
    if url:
        return url.rstrip("/")
    server: SGLangServer = request.getfixturevalue("sglang_server")
    return server.url
