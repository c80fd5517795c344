"""The smg tier: SGLang's router (``smg``, ``pip install smg==1.13.0``) in front of two
stand-in text engines, each in its own process.

Run with ``python -m pytest tests/smg -m smg -p no:cacheprovider`` (``.ci/run`` installs
smg first). A plain ``python -m pytest`` deselects the tier; in it, every test fails,
never skips, when smg is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles_lite.engine.smg import SMG_FLAGS
from miles_lite.testing import SmgRouter, TextEngineProcessGroup, TextStandInConfig
from tests.conftest import separate_tier

HERE = Path(__file__).resolve().parent
#: Per-test limit in this tier: engines and the router start in a few seconds.
TEST_TIMEOUT_S = 240


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "smg: needs SGLang's router (pip install smg==1.13.0)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    separate_tier(config, items, HERE, "smg", TEST_TIMEOUT_S)


@pytest.fixture(scope="session", autouse=True)
def smg_installed() -> None:
    if importlib.util.find_spec("smg") is None:
        pytest.fail("smg is not installed: pip install smg==1.13.0 (the tier needs it)")


@pytest.fixture(scope="module")
def engines() -> Iterator[TextEngineProcessGroup]:
    """Two stand-in engines shared by a module's tests: a fast one (2 ms per token) and a
    slow one (50 ms), so that an early stop finds work in flight at the slow one."""
    configs = [TextStandInConfig(token_latency_s=0.002), TextStandInConfig(token_latency_s=0.05)]
    with TextEngineProcessGroup(configs) as group:
        yield group


@pytest.fixture(scope="module")
def smg(engines: TextEngineProcessGroup) -> Iterator[SmgRouter]:
    """smg over the module's engines, with the flags miles_lite tells users to run."""
    with SmgRouter(engines.urls, flags=SMG_FLAGS) as router:
        yield router
