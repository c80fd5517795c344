"""Compare the structure of two JSON answers: keys, types and nesting, not values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        # JSON has one number type; an int where the other side has a float is no difference
        # (0 vs 0.0 latencies), but a number where the other has a string is.
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def shape(
    value: Any, path: str = "$", out: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Every path in ``value`` (list elements as ``[]``) with the JSON types seen there."""
    if out is None:
        out = {}
    out.setdefault(path, set()).add(_type(value))
    if isinstance(value, dict):
        for key, item in value.items():
            shape(item, f"{path}.{key}", out)
    elif isinstance(value, list):
        for item in value:
            shape(item, f"{path}[]", out)
    return out


def shape_of_all(values: Iterable[Any]) -> dict[str, set[str]]:
    """The union of the shapes of several answers (one request kind, several runs)."""
    out: dict[str, set[str]] = {}
    for value in values:
        shape(value, "$", out)
    return out


def differences(real: dict[str, set[str]], stand_in: dict[str, set[str]]) -> list[str]:
    """Readable lines, one per path whose presence or types differ; [] when they agree.

    A path where either side saw ``null`` and the other a value only differs when the
    value types differ too (a running request's ``finish_reason`` is null, a finished one's
    an object).
    """
    lines = []
    for path in sorted(real.keys() | stand_in.keys()):
        if path not in stand_in:
            lines.append(f"only in real SGLang: {path} ({'|'.join(sorted(real[path]))})")
        elif path not in real:
            lines.append(f"only in the stand-in: {path} ({'|'.join(sorted(stand_in[path]))})")
        else:
            a = real[path] - {"null"}
            b = stand_in[path] - {"null"}
            if a and b and a != b:
                lines.append(
                    f"types differ at {path}: real {'|'.join(sorted(real[path]))}, "
                    f"stand-in {'|'.join(sorted(stand_in[path]))}"
                )
    return lines
