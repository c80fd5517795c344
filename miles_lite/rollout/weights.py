"""Updating the engines' weights between training steps (or while a rollout runs): the
public entry, :func:`update_weights` (``Rollout.update_weights``).

The orchestration is the router's (:meth:`Router.update_weights
<miles_lite.engine.router.Router.update_weights>`, in :mod:`miles_lite.engine.updates`,
beside the control calls and the versions it records): hold the leases, pause, push the
weights or bump the version, flush, read every engine's version, record it only when
some engine took it (fencing and catching up the others), continue. See that module for
the order and what is guaranteed.
"""

from __future__ import annotations

import os

from miles_lite.engine.router import Router
from miles_lite.engine.updates import WeightUpdateConfig, WeightUpdateReport

__all__ = ["WeightUpdateConfig", "WeightUpdateReport", "update_weights"]


async def update_weights(
    router: Router,
    model_path: str | os.PathLike[str] | None,
    *,
    version: str | int,
    config: WeightUpdateConfig | None = None,
    check: bool = True,
) -> WeightUpdateReport:
    """Update every engine of ``router`` to ``version``: :meth:`Router.update_weights
    <miles_lite.engine.router.Router.update_weights>` (see
    :func:`~miles_lite.engine.updates.update_engines`)."""
    return await router.update_weights(model_path, version=version, config=config, check=check)
