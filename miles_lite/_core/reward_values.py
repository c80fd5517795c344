"""The one rule for a reward value, however it arrives (a reward pool, a remote scorer, an
agent): a finite number (not a bool), or a dict whose numbers are finite.

Pure functions, below every package that scores (pools, the rollout's scorer, the remote
scorer, agents); the public home is :mod:`miles_lite.rewards.values`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Protocol

from miles_lite.errors import RewardError

__all__ = ["checked_scores", "reward_problem"]


def reward_problem(value: object) -> str | None:
    """Why ``value`` is not a reward, in a few words, or ``None`` when it is one.

    A reward is a finite real number (an int, a float, a NumPy scalar; not a bool), or a
    dict with str keys whose real-number values are finite (other values, such as DAPO's
    ``acc`` bool or ``pred`` string, ride along unchecked)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | dict):
        return "want a float or a dict"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"its key {key!r} is not a str"
            if _is_real(item) and not math.isfinite(item):
                return f"its {key!r} is {item!r}: a reward must be finite"
        return None
    if not math.isfinite(value):
        return "a reward must be finite"
    return None


class _Scored(Protocol):
    """What an error names of a sample (a :class:`~miles_lite.types.Sample`)."""

    @property
    def index(self) -> int: ...
    @property
    def group_index(self) -> int: ...
    @property
    def request_id(self) -> str | None: ...


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def checked_scores(
    name: str, scores: object, samples: Sequence[_Scored]
) -> list[float | dict[str, Any]]:
    """``scores`` that reward ``name`` gave ``samples``, checked: a list of one reward per
    sample (see :func:`reward_problem`); numbers become floats, dicts are kept.

    Raises :class:`~miles_lite.errors.RewardError` naming the reward, the first bad value,
    its sample (index, group, request id) and what is wrong, or the counts."""
    if not isinstance(scores, list) or len(scores) != len(samples):
        got = f"{len(scores)} scores" if isinstance(scores, list) else type(scores).__name__
        raise RewardError(
            f"reward {name!r} returned {got} for {len(samples)} samples "
            f"(indices {[s.index for s in samples]})"
        )
    out: list[float | dict[str, Any]] = []
    for score, sample in zip(scores, samples, strict=True):
        problem = reward_problem(score)
        if problem is not None:
            raise RewardError(
                f"reward {name!r} returned {score!r} for sample {sample.index} "
                f"(group {sample.group_index}): {problem}",
                request_id=sample.request_id,
            )
        out.append(score if isinstance(score, dict) else float(score))
    return out
