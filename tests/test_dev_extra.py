"""Every package the tests import comes with the README's test command (`pip install -e ".[dev]"`):
a test module importing something the dev extra does not bring fails collection on a fresh
machine only (CI's stop 35 failed so: `anthropic` was installed here by hand)."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
# Imported only inside the real tiers' own venvs, or only below Python 3.11 (anyio brings it there).
NOT_DEV = {"sglang", "miles", "uvicorn", "exceptiongroup"}


def dev_closure() -> set[str]:
    """pyproject.toml's dependencies and dev extra (read from the file: an installed copy's
    metadata may be stale) and everything they pull in, as canonical distribution names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = project["dependencies"] + project["optional-dependencies"]["dev"]
    seen: set[str] = set()
    todo = [(req.name, set(req.extras)) for req in map(Requirement, direct)]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        for line in reqs:
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return seen


def imported_top_levels(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def test_every_package_the_tests_import_comes_with_the_dev_extra() -> None:
    provided = dev_closure()
    dists = packages_distributions()
    local = {"miles_lite", "tests"} | {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    missing = []
    for module, where in imported_top_levels(ROOT / "tests").items():
        if module in sys.stdlib_module_names or module in local or module in NOT_DEV:
            continue
        owners = {canonicalize_name(d) for d in dists.get(module, [])}
        if not owners & provided:
            missing.append(f"{module} (first in {where.relative_to(ROOT)}; from {owners or '?'})")
    assert not missing, "imported by the tests but not brought by .[dev]: " + ", ".join(missing)
