"""What an install of miles-lite with some extras brings, read from the installed packages'
metadata, and which imported modules fall outside it.

    closure = declared_closure(base + demo_extra)   # distribution names, normalized
    outside = undeclared(imported_modules(stderr_of_python_X_importtime), closure)
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys

from packaging.requirements import Requirement

__all__ = ["declared_closure", "imported_modules", "normalized", "undeclared"]


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` (PEP 508 strings: pyproject.toml's, as a fresh
    install reads them) pull in, transitively, as the installed metadata declares them."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        key = (normalized(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            declared = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: it cannot have been imported either
        for text in declared:
            needed = Requirement(text)
            marker = needed.marker
            if marker is None or any(
                marker.evaluate({"extra": extra}) for extra in (key[1] or {""})
            ):
                todo.append(needed)
    return {name for name, _ in seen}


def imported_modules(importtime_stderr: str) -> set[str]:
    """The top-level modules a ``python -X importtime`` run imported (its stderr)."""
    modules = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                modules.add(name.split(".", 1)[0])
    return modules


def undeclared(modules: set[str], closure: set[str]) -> dict[str, list[str]]:
    """The imported third-party modules whose distributions are not in ``closure``: module
    -> its distributions."""
    provided = metadata.packages_distributions()
    outside = {}
    for module in sorted(modules):
        if module in sys.stdlib_module_names or module in sys.builtin_module_names:
            continue
        if module in ("miles_lite", "tests", "__main__"):
            continue
        dists = provided.get(module, [])
        # A module no distribution provides was an optional import that failed
        # (``-X importtime`` lists those too).
        if dists and not {normalized(d) for d in dists} & closure:
            outside[module] = dists
    return outside
