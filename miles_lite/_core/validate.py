"""Field checks every config shares: one message shape, no ``bool`` passing as an int.

Each check raises :class:`~miles_lite.errors.ConfigError` naming ``owner.field`` and the
bad value, and returns nothing.
"""

from __future__ import annotations

import math

from miles_lite.errors import ConfigError

__all__ = [
    "check_choice",
    "check_int",
    "check_number",
    "check_seconds",
    "check_type",
    "is_int",
    "is_number",
]


def is_int(value: object) -> bool:
    """Whether ``value`` is an int (``True``/``False`` are not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is a finite int or float (``bool`` is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_int(
    owner: str, name: str, value: object, *, minimum: int = 1, optional: bool = False
) -> None:
    """An int >= ``minimum`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if not is_int(value) or value < minimum:  # type: ignore[operator]
        allowed = f"an int >= {minimum}" + (" or None" if optional else "")
        raise ConfigError(f"{owner}.{name} must be {allowed}, got {value!r}")


def check_number(owner: str, name: str, value: object, *, minimum: float = 0.0) -> None:
    """A finite number >= ``minimum``."""
    if not is_number(value) or value < minimum:  # type: ignore[operator]
        raise ConfigError(f"{owner}.{name} must be a finite number >= {minimum:g}, got {value!r}")


def check_seconds(
    owner: str, name: str, value: object, *, optional: bool = False, zero: bool = False
) -> None:
    """A finite number of seconds > 0 (>= 0 with ``zero``; or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if not is_number(value) or value < 0 or (value == 0 and not zero):  # type: ignore[operator]
        allowed = f"a finite number of seconds {'>=' if zero else '>'} 0" + (
            " or None" if optional else ""
        )
        raise ConfigError(f"{owner}.{name} must be {allowed}, got {value!r}")


def check_choice(owner: str, name: str, value: object, choices: tuple[object, ...]) -> None:
    """One of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


def check_type(owner: str, name: str, value: object, kind: type | tuple[type, ...]) -> None:
    """An instance of ``kind``."""
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(f"{owner}.{name} must be a {names}, got {value!r}")
