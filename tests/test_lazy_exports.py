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
