"""The peer tier: the text benchmark's miles rows, against miles-rl 0.0.2 in its own venv.

Run with ``python -m pytest tests/peer -m peer -p no:cacheprovider`` after
``benchmarks/miles_peer/setup.sh`` (venv: ``$MILES_LITE_MILES_VENV`` or
``~/.cache/miles-lite/miles-peer-venv``). A plain ``python -m pytest`` deselects it. A
missing venv fails the tier, never skips it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import separate_tier

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "peer: needs miles' venv (benchmarks/miles_peer/setup.sh)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    separate_tier(config, items, HERE, "peer", 600)
