"""Write each lazily exporting package's ``__init__.pyi`` from its export table.

python scripts/export_stubs.py            # write the stubs
python scripts/export_stubs.py --check    # exit 1 if one differs (a test runs this)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from miles_lite._core.lazy import export_stub

#: The packages whose names load on first use (each has an ``_EXPORTS`` table).
PACKAGES = (
    "miles_lite",
    "miles_lite.engine",
    "miles_lite.pools",
    "miles_lite.rollout",
    "miles_lite.training",
)


def stub_path(package: str) -> Path:
    module = importlib.import_module(package)
    return Path(module.__file__ or "").with_suffix(".pyi")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale stubs")
    args = parser.parse_args()
    stale = []
    for package in PACKAGES:
        path, text = stub_path(package), export_stub(package)
        if not path.exists() or path.read_text() != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print("stale export stubs (run python scripts/export_stubs.py):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
