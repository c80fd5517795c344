"""Rewards by name: the built-in rewards a rollout uses when ``reward=`` names one that
``rewards=`` does not give.

:data:`BUILTIN_REWARDS` is the one table of names, for Python and the command line alike
(``--reward``): miles' ``rm_type`` names of the rule-based text rewards
(:data:`~miles_lite.rewards.text_rewards.TEXT_REWARDS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from miles_lite.errors import ConfigError
from miles_lite.rewards.text_rewards import TEXT_REWARDS

__all__ = ["BUILTIN_REWARDS", "with_builtin_rewards"]

#: The built-in rewards by name (read-only): ``math``, ``deepscaler``, ``dapo``, ``f1``.
BUILTIN_REWARDS: Mapping[str, Any] = MappingProxyType(dict(TEXT_REWARDS))


def with_builtin_rewards(
    rewards: Mapping[str, Any], kinds: Iterable[str | None], *, field: str = "reward"
) -> dict[str, Any]:
    """``rewards``, plus the built-in reward function of each kind in ``kinds`` that
    ``rewards`` does not hold (``None`` kinds are skipped). ``rewards`` wins: a kind it
    holds is never replaced.

    Usage: ``with_builtin_rewards({}, ["math"]) == {"math": math_reward}``.

    Raises :class:`~miles_lite.errors.ConfigError` for a kind that is neither in
    ``rewards`` nor built in, naming the built-ins and what to pass instead (``field``:
    the config field that named it, for the message).
    """
    resolved = dict(rewards)
    for kind in kinds:
        if kind is None or kind in resolved:
            continue
        function = BUILTIN_REWARDS.get(kind)
        if function is None:
            raise ConfigError(
                f"{field}={kind!r} is not a built-in reward ({', '.join(sorted(BUILTIN_REWARDS))})"
                f" and rewards= has no {kind!r} (it has {sorted(rewards)}): pass"
                f" rewards={{{kind!r}: your_reward}}, a picklable (samples) -> list[float]"
                " function, an async scorer or a ready pool"
            )
        resolved[kind] = function
    return resolved
