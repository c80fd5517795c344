"""What a reward may be: one rule for every way a reward arrives (a reward pool, a remote
scorer, an agent's return value).

:func:`reward_problem` says why a value is not a reward (``None`` when it is one);
:func:`checked_scores` checks a batch of them against its samples and raises
:class:`~miles_lite.errors.RewardError` naming the sample and the value. Both live in
``miles_lite._core.reward_values`` so that the reward pools and the rollout's scorer,
which sit below this package, use the same functions.
"""

from miles_lite._core.reward_values import checked_scores, reward_problem

__all__ = ["checked_scores", "reward_problem"]
