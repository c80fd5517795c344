"""Package names are imported on first use, so a light import stays light (parser workers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import miles_lite.engine
import miles_lite.pools


def test_an_exported_name_is_imported_when_asked_for_and_kept() -> None:
    pool_class = miles_lite.pools.ParserPool
    from miles_lite.pools.parser_pool import ParserPool

    assert pool_class is ParserPool
    assert vars(miles_lite.pools)["ParserPool"] is ParserPool
    assert {"ParserPool", "Arena"} <= set(dir(miles_lite.pools))


def test_a_name_the_package_does_not_export_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"'miles_lite\.engine' has no attribute 'Nope'"):
        _ = miles_lite.engine.Nope  # type: ignore[attr-defined]


def test_the_top_level_and_the_errors_import_neither_torch_nor_aiohttp() -> None:
    code = (
        "import sys, miles_lite, miles_lite.errors, miles_lite.pools.parser_worker;"
        "print(sorted({'torch', 'aiohttp'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "package",
    [
        "miles_lite",
        "miles_lite.engine",
        "miles_lite.pools",
        "miles_lite.rollout",
        "miles_lite.training",
    ],
)
def test_the_export_table_is_the_one_list_of_names(package: str) -> None:
    # __all__ is made from the table, every name of it loads, and the .pyi that type
    # checkers and editors read is the table's (scripts/export_stubs.py writes it).
    import importlib
    from pathlib import Path

    from miles_lite._core.lazy import export_stub

    pkg = importlib.import_module(package)
    names = [name for names in pkg._EXPORTS.values() for name in names]
    assert pkg.__all__ == sorted(names) and len(set(names)) == len(names)
    assert all(getattr(pkg, name) is not None for name in pkg.__all__)
    stub = Path(pkg.__file__).with_suffix(".pyi")
    assert stub.read_text() == export_stub(package), "run python scripts/export_stubs.py"


def test_a_name_listed_twice_is_refused() -> None:
    from miles_lite._core.lazy import lazy_exports

    with pytest.raises(ValueError, match="exports 'Arena' twice"):
        lazy_exports("miles_lite.pools", {"a": ["Arena"], "b": ["Arena"]})
