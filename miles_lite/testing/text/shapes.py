"""Compare two SGLang answers by shape: the same keys, in the same order, with the same types.

For the stand-in's tests against ``tests/data/sglang_captures`` and for differential tests
of a real server against the stand-in::

    diff = shape_diff(stand_in_answer, real_answer)
    assert not diff, "\\n".join(diff)

Values may differ (ids, texts, log-probs, times); ints and floats count as one type
("number", as JSON has one), a list's shape is its first element's. Some keys are null
or a map depending on the engine's state (``cached_tokens_details``: null without a
prefix-cache hit): name them in ``nullable`` and either form matches.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["NULLABLE_KEYS", "shape_diff", "wire_shape"]

#: Keys whose value is null or a map depending on the engine's state, not on the request.
NULLABLE_KEYS = frozenset({"cached_tokens_details"})


def wire_shape(value: Any) -> Any:
    """Keys and types of a JSON value, recursively (see the module docstring)."""
    if isinstance(value, dict):
        return {k: wire_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wire_shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def shape_diff(got: Any, want: Any, *, nullable: Iterable[str] = NULLABLE_KEYS) -> list[str]:
    """Where ``got``'s shape differs from ``want``'s: one readable line per difference
    (a missing key, an extra key, another type, another key order), empty if none."""
    return _diff(wire_shape(got), wire_shape(want), "$", frozenset(nullable))


def _diff(got: Any, want: Any, path: str, nullable: frozenset[str]) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        lines = [f"{path}.{k}: missing" for k in want if k not in got]
        lines += [f"{path}.{k}: not in the reference answer" for k in got if k not in want]
        for k in want:
            if k not in got:
                continue
            if k in nullable and "null" in (got[k], want[k]):
                continue
            lines += _diff(got[k], want[k], f"{path}.{k}", nullable)
        if not lines and list(got) != list(want):
            lines.append(f"{path}: key order {list(got)} != {list(want)}")
        return lines
    if isinstance(want, list) and isinstance(got, list):
        return _diff(got[0], want[0], f"{path}[0]", nullable) if want and got else []
    return [] if got == want else [f"{path}: {got} != the reference's {want}"]
