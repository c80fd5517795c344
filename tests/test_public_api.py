from __future__ import annotations

import importlib
import inspect
import types

import pytest

import miles_lite

PACKAGES = [
    "miles_lite",
    "miles_lite.codecs",
    "miles_lite.engine",
    "miles_lite.pools",
    "miles_lite.rewards",
    "miles_lite.testing",
]


def isort_key(name: str) -> tuple[int, str]:
    # Constants, then classes, then functions: ruff's RUF022 (isort-style) order.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_top_level_exports_the_public_api() -> None:
    expected = {
        "DiffusionRollout",
        "DiffusionRolloutConfig",
        "DiffusionSamplingParams",
        "ParserPool",
        "ParserPoolConfig",
        "RewardPool",
        "EngineClient",
        "Router",
        "Sample",
        "SampleStatus",
        "MilesLiteError",
        "run_sync",
    }
    assert expected <= set(miles_lite.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_complete_and_documented(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(set(exported), key=isort_key)
    for attr in exported:
        obj = getattr(module, attr)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name}.{attr} has no docstring"
    public = {
        attr
        for attr, obj in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(obj, types.ModuleType)
        and attr != "annotations"
    }
    assert public == set(exported) | (public & {"tiny_clip"})


def test_every_error_says_what_it_is_raised_for() -> None:
    for name in miles_lite.__all__:
        obj = getattr(miles_lite, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert obj.__doc__ and obj.__doc__.startswith("Raised when"), name
            assert issubclass(obj, miles_lite.MilesLiteError)


def test_the_package_ships_its_types() -> None:
    from importlib.resources import files

    assert files("miles_lite").joinpath("py.typed").is_file()
