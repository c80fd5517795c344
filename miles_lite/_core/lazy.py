"""Package names imported on first use (PEP 562), so that importing a light module does not
import the whole library.

Why: every import of ``miles_lite.x.y`` first runs ``miles_lite/__init__.py`` and
``miles_lite/x/__init__.py``. Parser workers import only the codecs, the page table and
the blocking HTTP exchange; a package ``__init__`` that re-exported eagerly made each of
them import torch and aiohttp too (about 160 MB and a second of start-up per worker,
against about 15 MB and tens of milliseconds).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name of ``exports[module]`` is
    imported from ``module`` when first asked for, then kept in the package's namespace.

    Usage, at the end of a package ``__init__``::

        __getattr__, __dir__ = lazy_exports(__name__, {"pkg.mod": ["Name"]})

    Raises AttributeError for a name the package does not export.
    """
    origin = {name: module for module, names in exports.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> object:
        module = origin.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *origin})

    return __getattr__, __dir__
