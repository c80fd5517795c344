"""SGLang's control endpoints: their paths, request bodies and how to read the answers.

Pure: no I/O. :mod:`miles_lite.engine.control` sends them.

SGLang 0.5.23 answers ``GET /v1/loads?include=core`` with one entry per data-parallel
rank::

    {"timestamp": "...", "version": "0.5.23", "accelerator": ..., "num_accelerators": 1,
     "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 0, ...}]}
"""

from __future__ import annotations

from typing import Any

__all__ = ["ABORT_PATH", "LOADS_PATH", "abort_all_body", "abort_body", "busy_requests"]

ABORT_PATH = "/abort_request"
LOADS_PATH = "/v1/loads?include=core"


def abort_body(rid: str) -> dict[str, Any]:
    """The ``/abort_request`` body aborting one request (matched by rid prefix: rids are
    fixed-length, so no rid is a prefix of another)."""
    return {"rid": rid}


def abort_all_body() -> dict[str, Any]:
    """The ``/abort_request`` body aborting every request of the engine."""
    return {"abort_all": True}


def busy_requests(loads: Any) -> int | None:
    """Running plus waiting requests over all ranks of a ``/v1/loads`` answer; None if the
    answer does not say."""
    if not isinstance(loads, dict) or not isinstance(loads.get("loads"), list):
        return None
    total = 0
    for rank in loads["loads"]:
        if not isinstance(rank, dict):
            return None
        running, waiting = rank.get("num_running_reqs"), rank.get("num_waiting_reqs")
        if type(running) is not int or type(waiting) is not int:
            return None
        total += running + waiting
    return total
