"""SGLang's control endpoints: their paths, request bodies and how to read the answers.

Pure: no I/O. :mod:`miles_lite.engine.control` sends them.

The weight-update endpoints of SGLang 0.5.23 (``tests/data/sglang_captures``):

- ``POST /pause_generation {"mode": "abort"|"retract"|"in_place"}`` (a body is required)
  and ``POST /continue_generation {}`` answer ``{"message": ..., "status": "ok"}``;
- ``POST /update_weights_from_disk {"model_path", "weight_version", "flush_cache"}``
  answers ``{"success", "message", "num_paused_requests"}``, with HTTP 400 and
  ``success: false`` when it failed. ``flush_cache`` defaults to true, and under an
  ``in_place`` pause the flush fails *after* the weights were swapped: always send it;
  :mod:`miles_lite.engine.control` flushes on its own, where the mode allows it;
- ``POST /update_weight_version {"new_version", "abort_all_requests"}``:
  ``abort_all_requests`` defaults to **true** (every running request dies), so it is
  always sent false;
- ``POST /flush_cache`` answers 200 with a fixed text once the cache was flushed, 400
  (``Flush cache failed.``) while requests run (not paused, or paused ``in_place``); its
  ``?timeout=`` waits for an idle engine that a paused one never becomes: not used;
- ``GET /model_info`` reports ``weight_version`` (there is no ``/get_weight_version``).

SGLang 0.5.23 answers ``GET /v1/loads?include=core`` with one entry per data-parallel
rank::

    {"timestamp": "...", "version": "0.5.23", "accelerator": ..., "num_accelerators": 1,
     "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 0, ...}]}
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "ABORT_PATH",
    "CONTINUE_PATH",
    "FLUSH_CACHE_PATH",
    "LOADS_PATH",
    "MODEL_INFO_PATH",
    "PAUSE_PATH",
    "UPDATE_FROM_DISK_PATH",
    "UPDATE_VERSION_PATH",
    "PauseMode",
    "abort_all_body",
    "abort_body",
    "busy_requests",
    "check_status_ok",
    "check_update_answer",
    "model_info_version",
    "pause_body",
    "update_from_disk_body",
    "update_version_body",
]

ABORT_PATH = "/abort_request"
LOADS_PATH = "/v1/loads?include=core"
PAUSE_PATH = "/pause_generation"
CONTINUE_PATH = "/continue_generation"
FLUSH_CACHE_PATH = "/flush_cache"
UPDATE_FROM_DISK_PATH = "/update_weights_from_disk"
UPDATE_VERSION_PATH = "/update_weight_version"
MODEL_INFO_PATH = "/model_info"


class PauseMode(str, enum.Enum):
    """How ``/pause_generation`` holds the requests in flight.

    ``RETRACT``: they go back to the queue and their KV is freed; after a cache flush
    they are recomputed under the new weights on continue (the one mode measured exact).
    ``IN_PLACE``: they stay in the batch with their KV, computed by the old weights; the
    cache cannot be flushed until they end. ``ABORT``: they are aborted (and answer with
    their partial output).
    """

    ABORT = "abort"
    RETRACT = "retract"
    IN_PLACE = "in_place"


def pause_body(mode: PauseMode) -> dict[str, Any]:
    """The ``/pause_generation`` body (SGLang requires one)."""
    return {"mode": PauseMode(mode).value}


def update_from_disk_body(model_path: str, version: str | None) -> dict[str, Any]:
    """The ``/update_weights_from_disk`` body: load ``model_path``, report ``version``
    (``None``: keep the version), never abort, never flush (the caller flushes where the
    pause mode allows it: SGLang's own flush fails an ``in_place`` update after the swap).
    """
    body: dict[str, Any] = {
        "model_path": model_path,
        "abort_all_requests": False,
        "flush_cache": False,
    }
    if version is not None:
        body["weight_version"] = version
    return body


def update_version_body(version: str) -> dict[str, Any]:
    """The ``/update_weight_version`` body: ``abort_all_requests`` is always false (its
    default, true, kills every running request)."""
    return {"new_version": version, "abort_all_requests": False}


def check_status_ok(answer: Any) -> str | None:
    """Why a pause or continue answer is not ``{"status": "ok", ...}``; None if it is."""
    if isinstance(answer, dict) and answer.get("status") == "ok":
        return None
    return f"answered {answer!r:.200}, not a status ok"


def check_update_answer(answer: Any) -> str | None:
    """Why a weight-update answer is not ``{"success": true, ...}``; None if it is."""
    if isinstance(answer, dict) and answer.get("success") is True:
        return None
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        return f"answered success={answer.get('success')!r}: {answer['message']}"
    return f"answered {answer!r:.200}, not success true"


def model_info_version(answer: Any) -> str | None:
    """The ``weight_version`` of a ``/model_info`` answer; None if it names none (a
    string is required: a number or a missing key is not a version)."""
    if isinstance(answer, dict):
        version = answer.get("weight_version")
        if isinstance(version, str):
            return version
    return None


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
