"""Stopping what runs at the engines: the one sender of ``/abort_request``.

:func:`abort_requests` (early stop): per engine, concurrently, one POST per rid (or one
``abort_all``), each with a short timeout and no retry; then ``GET /v1/loads`` is polled
until the engine reports no running and no waiting request, re-sending the abort each
round (as slime does: requests that arrived in between are caught too), or until the
bound passes. An engine that never answers costs at most the bound, never more, and
stalls no other. :func:`abort_request` aborts one rid (a request whose caller went away
or timed out), best effort and bounded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import anyio

from miles_lite.engine.client import EngineClient
from miles_lite.errors import EngineError, EngineStatusError, MilesLiteError
from miles_lite.sglang.control import (
    ABORT_PATH,
    LOADS_PATH,
    abort_all_body,
    abort_body,
    busy_requests,
)

__all__ = ["AbortReport", "EngineAbort", "abort_request", "abort_requests"]


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
                    loads = await client.get_json(url, LOADS_PATH, timeout_s=timeout_s, retry=False)
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
        await client.post_json(url, ABORT_PATH, abort_all_body(), timeout_s=timeout_s, retry=False)
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
            url, ABORT_PATH, abort_body(rid), request_id=rid, timeout_s=timeout_s, retry=False
        )
    except MilesLiteError as exc:
        errors.append(exc)


async def abort_request(client: EngineClient, url: str, rid: str, *, timeout_s: float) -> bool:
    """Abort one request ``rid`` at ``url``: one attempt, bounded by ``timeout_s`` and
    shielded from cancellation (it runs when its caller was just cancelled). Returns
    whether the engine took it; an engine that is gone or busy is not an error here (the
    rollout's own abort repeats until the engine is idle)."""
    with anyio.move_on_after(timeout_s, shield=True):
        try:
            await client.post_json(
                url, ABORT_PATH, abort_body(rid), request_id=rid, timeout_s=timeout_s, retry=False
            )
        except EngineError:
            return False
        return True
    return False
