"""Noise seeds from (base seed, rollout id, group, sample): reproducible, never repeated.

Before miles_diffusion's "per-group seed" fix, every rollout reused the same seeds, so
``log_prob_old`` was constant for the whole run. Here a group's seeds are a hash of the
base seed, the rollout id and the group's position, so two rollouts of the same prompts
draw different noise, and the same rollout id draws the same noise again.
"""

from __future__ import annotations

import hashlib

__all__ = ["SEED_LIMIT", "group_seeds"]

#: SGLang takes seeds as 31-bit non-negative ints.
SEED_LIMIT = 2**31


def group_seeds(base_seed: int, rollout_id: int, group: int, n_samples: int) -> list[int]:
    """The seeds of one group's ``n_samples`` samples: consecutive, all below 2**31.

    Consecutive because a diffusion engine gives sample ``i`` of a request the request's
    seed ``+ i``: a microgroup sends its first sample's seed and the rest follow.
    """
    if n_samples >= SEED_LIMIT:
        raise ValueError(f"n_samples must be < 2**31, got {n_samples}")
    key = f"{base_seed}:{rollout_id}:{group}".encode()
    digest = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    first = digest % (SEED_LIMIT - n_samples)
    return [first + j for j in range(n_samples)]
