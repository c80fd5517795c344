from __future__ import annotations

import importlib

import pytest

import miles_lite

PACKAGES = ["miles_lite", "miles_lite.codecs", "miles_lite.engine", "miles_lite.generate",
            "miles_lite.pipeline", "miles_lite.pools", "miles_lite.rewards", "miles_lite.testing"]


def test_top_level_exports_the_public_api() -> None:
    expected = {
        "DiffusionRollout", "DiffusionRolloutConfig", "DiffusionSamplingParams", "ParserPool",
        "ParserPoolConfig", "RewardPool", "EngineClient", "Router", "Sample", "SampleStatus",
        "MilesLiteError", "run_sync",
    }
    assert expected <= set(miles_lite.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_unique_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported))
    assert exported == sorted(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr} is in __all__ but missing"
        assert not attr.startswith("_")


def test_every_error_says_what_it_is_raised_for() -> None:
    for name in miles_lite.__all__:
        obj = getattr(miles_lite, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert obj.__doc__ and obj.__doc__.startswith("Raised when"), name
            assert issubclass(obj, miles_lite.MilesLiteError)
