"""Weights a test updates its engines to: a tiny model's copy with perturbed embeddings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import torch


async def saved(module: Any, folder: Path, seed: int) -> Any:
    """A copy of ``module`` with perturbed embeddings, saved to ``folder`` (in a thread)."""

    def make() -> Any:
        trained = copy.deepcopy(module)
        with torch.no_grad():
            weight = trained.model.embed_tokens.weight
            weight.add_(
                0.5 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed))
            )
        trained.save_pretrained(str(folder))
        return trained

    return await anyio.to_thread.run_sync(make)
