"""Dotted paths to objects, and the one-line errors of the command line.

The only place a ``module.name`` string becomes an object; the library itself takes
callables and objects.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from miles_lite.errors import ConfigError, EngineNotReadyError, MilesLiteError

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["CliError", "load_function", "load_object", "not_ready_line", "one_line_errors"]


class CliError(Exception):
    """A mistake on the command line or in what it points at (a file, an engine), said in
    one line by ``main``; never a library error."""


def load_object(path: str) -> Any:
    """Import ``package.module.name``; ``ConfigError`` naming the path when it does not
    resolve (no such module, no such name)."""
    if not isinstance(path, str):
        raise ConfigError(f"a dotted path must be a str 'module.name', got {path!r}")
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"path {path!r} must be 'module.name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot load {path!r}: no module {module_name!r} ({exc})") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"cannot load {path!r}: module {module_name!r} has no {attr!r}") from exc


def load_function(path: str) -> Callable[..., Any]:
    """:func:`load_object` for a callable; ``ConfigError`` naming the path if it is not."""
    fn = load_object(path)
    if not callable(fn):
        raise ConfigError(f"{path!r} is not callable (it is a {type(fn).__name__})")
    return fn  # type: ignore[no-any-return]


def _leaf(exc: BaseException) -> BaseException:
    """The one error inside nested single-error exception groups (anyio task groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextmanager
def one_line_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn the mistakes a user makes into a :class:`CliError` (one line): any
    :class:`~miles_lite.errors.MilesLiteError` raised out of opening or running a rollout
    (per-sample failures never raise), and the ``extra`` types (a stand-in's
    ``ValueError`` and ``StandInError``)."""
    try:
        yield
    except CliError:
        raise
    except BaseException as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, EngineNotReadyError):
            raise CliError(not_ready_line(leaf)) from exc
        if isinstance(leaf, (MilesLiteError, OSError, *extra)):
            raise CliError(" ".join(str(leaf).split()) or type(leaf).__name__) from exc
        raise


def not_ready_line(exc: EngineNotReadyError) -> str:
    """The command line's words for engines that did not answer ``/health``: its flags
    (``--engine-url``, ``--wait-for-engines``), not the config class a Python user sets."""
    said = []
    if exc.refused:
        said.append(f"nothing listens at {', '.join(exc.refused)} (connection refused on /health)")
    quiet = [url for url in exc.urls if url not in exc.refused]
    if quiet:
        said.append(f"no answer to /health within {exc.timeout_s:g} s from {', '.join(quiet)}")
    return (
        "; ".join(said) + "; check --engine-url and that the server runs there (an engine"
        " still loading weights refuses connections, then answers 503: give it time with"
        " --wait-for-engines 600)"
    )
