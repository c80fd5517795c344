"""Reward functions and the remote-API scorer.

A reward function is a picklable callable ``(samples: list[Sample]) -> list[float | dict]``,
one score per sample, run in a reward pool worker (:class:`ClipReward`,
:func:`latent_mean_reward`, ...). :class:`ApiScorer` is the async alternative: a client of a
remote scoring API, run on the event loop with at most ``max_concurrency`` requests in flight.
:data:`BUILTIN_REWARDS` names the built-in ones; a text rollout's ``reward="math"`` finds
its function there when ``rewards=`` does not give one (:func:`with_builtin_rewards`).
Importing this package does not import torch or transformers.
"""

from miles_lite.rewards.api_scorer import (
    ApiScorer,
    ApiScorerStatistics,
    decode_scores,
    encode_samples,
)
from miles_lite.rewards.builtin import BUILTIN_REWARDS, with_builtin_rewards
from miles_lite.rewards.clip_reward import CLIP_MEAN, CLIP_STD, ClipReward
from miles_lite.rewards.functions import (
    ConstantReward,
    constant_reward,
    latent_mean_reward,
    response_length_reward,
)
from miles_lite.rewards.text_rewards import (
    TEXT_REWARDS,
    dapo_reward,
    extract_boxed,
    f1_reward,
    f1_score,
    final_answer,
    math_reward,
    normalize_answer,
)
from miles_lite.rewards.tiny_clip import tiny_clip

__all__ = [
    "BUILTIN_REWARDS",
    "CLIP_MEAN",
    "CLIP_STD",
    "TEXT_REWARDS",
    "ApiScorer",
    "ApiScorerStatistics",
    "ClipReward",
    "ConstantReward",
    "constant_reward",
    "dapo_reward",
    "decode_scores",
    "encode_samples",
    "extract_boxed",
    "f1_reward",
    "f1_score",
    "final_answer",
    "latent_mean_reward",
    "math_reward",
    "normalize_answer",
    "response_length_reward",
    "tiny_clip",
    "with_builtin_rewards",
]
