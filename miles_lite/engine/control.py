"""Stopping what runs at the engines: ``/abort_request``, then ``/v1/loads`` until idle.

Per engine, concurrently: one POST per rid (``{"rid": ...}``, matched by prefix, so rids
must be fixed-length; unknown rids are ignored) or one ``{"abort_all": true}``, each with
a short timeout and no retry; then ``GET /v1/loads?include=core`` is polled until the
engine reports no running and no waiting request, re-sending the abort each round (as
slime does: requests that arrived in between are caught too), or until the bound passes.
An engine that never answers costs at most the bound, never more, and stalls no other.

SGLang 0.5.23 answers ``/v1/loads`` with one entry per data-parallel rank::

    {"timestamp": "...", "version": "0.5.23", "accelerator": ..., "num_accelerators": 1,
     "loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 0, ...}]}
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite.engine.client import EngineClient
from miles_lite.errors import EngineStatusError, MilesLiteError

__all__ = ["AbortReport", "EngineAbort", "abort_requests", "busy_requests"]


@dataclass(frozen=True, slots=True)
class EngineAbort:
    """How one engine's abort went: rids sent, whether it reached idle, time, last error."""

    url: str
    rids_sent: int
    idle: bool
    elapsed_s: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class AbortReport:
    """Every engine's :class:`EngineAbort`, and the time the whole abort took (seconds)."""

    engines: tuple[EngineAbort, ...]
    elapsed_s: float

    @property
    def idle(self) -> bool:
        """Whether every engine reported nothing running and nothing waiting."""
        return all(e.idle for e in self.engines)


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
        if not isinstance(running, int) or not isinstance(waiting, int):
            return None
        total += running + waiting
    return total


async def abort_requests(
    client: EngineClient,
    rids_by_url: Mapping[str, Collection[str]],
    *,
    abort_all: bool = False,
    timeout_s: float = 2.0,
    settle_timeout_s: float = 10.0,
    poll_interval_s: float = 0.05,
    resend_interval_s: float = 0.5,
) -> AbortReport:
    """Abort ``rids_by_url[url]`` at each engine (or everything with ``abort_all``) and
    wait, at most ``settle_timeout_s``, until each reports idle (see the module doc).

    ``timeout_s`` bounds each abort or loads call; the aborts are sent again every
    ``resend_interval_s`` while the engine is busy. Never raises for an engine's failure
    (it is in the report); cancellation propagates.
    """
    started = time.monotonic()
    results: list[EngineAbort] = []

    async def one(url: str, rids: Collection[str]) -> None:
        t0 = time.monotonic()
        sent = 0
        error: str | None = None
        idle = False
        last_sent = -math.inf
        with anyio.move_on_after(settle_timeout_s):
            while True:
                try:
                    if time.monotonic() - last_sent >= resend_interval_s:
                        sent += await _send_aborts(client, url, rids, abort_all, timeout_s)
                        last_sent = time.monotonic()
                    loads = await client.get_json(
                        url, "/v1/loads?include=core", timeout_s=timeout_s, retry=False
                    )
                except EngineStatusError as exc:
                    error = f"cannot tell whether it is idle: {exc}"
                    break  # no /v1/loads here (an older engine): nothing more to learn
                except MilesLiteError as exc:
                    error = str(exc)
                    await anyio.sleep(poll_interval_s)
                    continue
                busy = busy_requests(loads)
                if busy is None:
                    error = f"cannot tell whether it is idle: /v1/loads answered {loads!r:.200}"
                    break
                if busy == 0:
                    idle = True
                    break
                await anyio.sleep(poll_interval_s)
        if not idle and error is None:
            error = f"still busy after {settle_timeout_s} s"
        results.append(EngineAbort(url, sent, idle, time.monotonic() - t0, error))

    async with anyio.create_task_group() as tg:
        for url, rids in rids_by_url.items():
            tg.start_soon(one, url, rids)
    order = list(rids_by_url)
    results.sort(key=lambda e: order.index(e.url))
    return AbortReport(tuple(results), time.monotonic() - started)


async def _send_aborts(
    client: EngineClient, url: str, rids: Collection[str], abort_all: bool, timeout_s: float
) -> int:
    """Send the aborts of one engine at once; raises the first failure, a plain error (not
    an exception group, so that the caller's retry loop sees it)."""
    if abort_all:
        await client.post_json(
            url, "/abort_request", {"abort_all": True}, timeout_s=timeout_s, retry=False
        )
        return 1
    errors: list[MilesLiteError] = []
    async with anyio.create_task_group() as tg:
        for rid in rids:
            tg.start_soon(_abort_one, client, url, rid, timeout_s, errors)
    if errors:
        raise errors[0]
    return len(rids)


async def _abort_one(
    client: EngineClient, url: str, rid: str, timeout_s: float, errors: list[MilesLiteError]
) -> None:
    # One attempt: the loop re-sends every resend_interval_s while the engine is busy.
    try:
        await client.post_json(
            url, "/abort_request", {"rid": rid}, request_id=rid, timeout_s=timeout_s, retry=False
        )
    except MilesLiteError as exc:
        errors.append(exc)
