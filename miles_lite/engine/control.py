"""Controlling what runs at the engines: the one sender of aborts, pauses, weight updates,
version bumps and cache flushes.

:func:`abort_requests` (early stop): per engine, concurrently, one POST per rid (or one
``abort_all``), each with a short timeout and no retry; then ``GET /v1/loads`` is polled
until the engine reports no running and no waiting request, re-sending the abort each
round (as slime does: requests that arrived in between are caught too), or until the
bound passes. An engine that never answers costs at most the bound, never more, and
stalls no other. :func:`abort_request` aborts one rid (a request whose caller went away
or timed out), best effort and bounded.

The weight-update calls (:func:`pause_generation`, :func:`continue_generation`,
:func:`update_weights_from_disk`, :func:`update_weight_version`,
:func:`read_weight_versions`, and the prefix-cache calls of
:mod:`miles_lite.engine.cache_control`, built on the same fan-out) go to every engine at
once, each bounded in time, one attempt per engine (a control call is not idempotent
enough to resend blindly; the flush alone is repeated, with backoff, while the engine
answers that it cannot flush yet). They never raise for an engine's failure:
a :class:`ControlReport` holds each engine's outcome with its typed error, and
:meth:`ControlReport.raise_for_failures` raises one
:class:`~miles_lite.errors.EngineControlError` naming every engine that failed.
Cancellation propagates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite.engine.http.client import EngineClient
from miles_lite.errors import (
    EngineControlError,
    EngineError,
    EngineStatusError,
    MilesLiteError,
)
from miles_lite.sglang.control import (
    ABORT_PATH,
    CONTINUE_PATH,
    LOADS_PATH,
    MODEL_INFO_PATH,
    PAUSE_PATH,
    UPDATE_FROM_DISK_PATH,
    UPDATE_VERSION_PATH,
    PauseMode,
    abort_all_body,
    abort_body,
    busy_requests,
    check_status_ok,
    check_update_answer,
    model_info_version,
    pause_body,
    update_from_disk_body,
    update_version_body,
)

__all__ = [
    "AbortReport",
    "ControlReport",
    "EngineAbort",
    "EngineOutcome",
    "abort_request",
    "abort_requests",
    "continue_generation",
    "pause_generation",
    "read_weight_versions",
    "update_weight_version",
    "update_weights_from_disk",
]


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
                    loads = await client.get_json(
                        url, LOADS_PATH, timeout_s=timeout_s, retry=False, control=True
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
            url, ABORT_PATH, abort_all_body(), timeout_s=timeout_s, retry=False, control=True
        )
        return 1
    errors: list[MilesLiteError] = []
    async with anyio.create_task_group() as tg:
        for rid in rids:
            tg.start_soon(_abort_one, client, url, rid, timeout_s, errors)
    if errors:
        raise errors[0]
    return len(rids)


async def _post_abort(client: EngineClient, url: str, rid: str, timeout_s: float) -> None:
    """``POST /abort_request`` of ``rid`` at ``url``: one attempt, a control call."""
    await client.post_json(
        url,
        ABORT_PATH,
        abort_body(rid),
        request_id=rid,
        timeout_s=timeout_s,
        retry=False,
        control=True,
    )


async def _abort_one(
    client: EngineClient, url: str, rid: str, timeout_s: float, errors: list[MilesLiteError]
) -> None:
    # One attempt: the loop re-sends every resend_interval_s while the engine is busy.
    try:
        await _post_abort(client, url, rid, timeout_s)
    except MilesLiteError as exc:
        errors.append(exc)


async def abort_request(client: EngineClient, url: str, rid: str, *, timeout_s: float) -> bool:
    """Abort one request ``rid`` at ``url``: one attempt, bounded by ``timeout_s`` and
    shielded from cancellation (it runs when its caller was just cancelled). Returns
    whether the engine took it; an engine that is gone or busy is not an error here (the
    rollout's own abort repeats until the engine is idle)."""
    with anyio.move_on_after(timeout_s, shield=True):
        try:
            await _post_abort(client, url, rid, timeout_s)
        except EngineError:
            return False
        return True
    return False


# -- weight updates ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineOutcome:
    """One engine's part of a control call: ``error`` (typed; None if it took the call),
    ``elapsed_s``, ``attempts`` (calls sent: more than one only for a flush that had to
    wait), ``version`` (what ``/model_info`` reported, for version reads) and
    ``cached_tokens`` (the canary's prompt tokens found cached, for canary probes)."""

    url: str
    elapsed_s: float
    error: EngineError | None = None
    attempts: int = 1
    version: str | None = None
    cached_tokens: int | None = None

    @property
    def ok(self) -> bool:
        """Whether the engine took the call."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class ControlReport:
    """Every engine's :class:`EngineOutcome` of one control ``action`` (in the order the
    URLs were given), and the time the whole fan-out took (seconds)."""

    action: str
    engines: tuple[EngineOutcome, ...]
    elapsed_s: float

    @property
    def ok(self) -> bool:
        """Whether every engine took the call."""
        return all(e.ok for e in self.engines)

    @property
    def failed(self) -> tuple[str, ...]:
        """The URLs of the engines that did not take it."""
        return tuple(e.url for e in self.engines if not e.ok)

    def outcome(self, url: str) -> EngineOutcome:
        """The outcome at ``url``; ``KeyError`` if the call did not go there."""
        for engine in self.engines:
            if engine.url == url:
                return engine
        raise KeyError(f"{self.action} did not go to {url!r}")

    def raise_for_failures(self) -> None:
        """Raise :class:`~miles_lite.errors.EngineControlError` naming each engine that
        failed, with its error (``failures``); nothing if all took the call."""
        failures = {e.url: e.error for e in self.engines if e.error is not None}
        if failures:
            raise EngineControlError(
                f"{self.action} failed at {len(failures)} of {len(self.engines)} engine(s): "
                + "; ".join(f"{url}: {error}" for url, error in failures.items()),
                failures=failures,
            )


#: One engine's call: returns the outcome's extra fields; raises an EngineError.
_Call = Callable[[str], Awaitable[dict[str, Any]]]


async def _fan_out(action: str, urls: Sequence[str], call: _Call) -> ControlReport:
    """``call(url)`` at every engine concurrently; each failure kept with its engine."""
    started = time.monotonic()
    outcomes: dict[str, EngineOutcome] = {}

    async def one(url: str) -> None:
        t0 = time.monotonic()
        try:
            extra = await call(url)
        except EngineError as exc:
            exc.with_context(url=url)
            outcomes[url] = EngineOutcome(url, time.monotonic() - t0, exc)
        else:
            outcomes[url] = EngineOutcome(url, time.monotonic() - t0, **extra)

    async with anyio.create_task_group() as tg:
        for url in dict.fromkeys(urls):
            tg.start_soon(one, url)
    engines = tuple(outcomes[url] for url in dict.fromkeys(urls))
    return ControlReport(action, engines, time.monotonic() - started)


def _refused(action: str, url: str, why: str | None) -> None:
    if why is not None:
        raise EngineControlError(f"{action} {why}", url=url)


async def _post_all(
    client: EngineClient,
    urls: Sequence[str],
    action: str,
    path: str,
    body: dict[str, Any],
    check: Callable[[Any], str | None],
    timeout_s: float,
    *,
    report_as: str | None = None,
) -> ControlReport:
    """POST ``body`` to ``path`` at every engine, one bounded attempt each; ``check(answer)``
    says why an engine refused (an error for that engine), or None."""

    async def call(url: str) -> dict[str, Any]:
        answer = await client.post_json(
            url, path, body, timeout_s=timeout_s, retry=False, control=True
        )
        _refused(action, url, check(answer))
        return {}

    return await _fan_out(report_as or action, urls, call)


async def pause_generation(
    client: EngineClient, urls: Sequence[str], mode: PauseMode, *, timeout_s: float = 10.0
) -> ControlReport:
    """``POST /pause_generation`` with ``mode`` at every engine (see :class:`PauseMode`);
    each call bounded by ``timeout_s``. Requests sent while an engine is paused wait there
    until it continues."""
    return await _post_all(
        client,
        urls,
        "pause_generation",
        PAUSE_PATH,
        pause_body(mode),
        check_status_ok,
        timeout_s,
        report_as=f"pause_generation({PauseMode(mode).value})",
    )


async def continue_generation(
    client: EngineClient, urls: Sequence[str], *, timeout_s: float = 10.0
) -> ControlReport:
    """``POST /continue_generation`` at every engine, each bounded by ``timeout_s``."""
    return await _post_all(
        client, urls, "continue_generation", CONTINUE_PATH, {}, check_status_ok, timeout_s
    )


async def update_weights_from_disk(
    client: EngineClient,
    urls: Sequence[str],
    model_path: str,
    *,
    version: str | None,
    timeout_s: float = 300.0,
) -> ControlReport:
    """``POST /update_weights_from_disk`` at every engine: load ``model_path`` (a folder
    the engine can read) and report ``version`` from now on; never aborts, never flushes
    (:func:`flush_cache` does, where the pause mode allows). Each call bounded by
    ``timeout_s`` (loading takes as long as the checkpoint)."""
    return await _post_all(
        client,
        urls,
        "update_weights_from_disk",
        UPDATE_FROM_DISK_PATH,
        update_from_disk_body(model_path, version),
        check_update_answer,
        timeout_s,
    )


async def update_weight_version(
    client: EngineClient, urls: Sequence[str], version: str, *, timeout_s: float = 10.0
) -> ControlReport:
    """``POST /update_weight_version`` at every engine, never aborting a request (the
    endpoint's default aborts them all); each call bounded by ``timeout_s``."""
    return await _post_all(
        client,
        urls,
        "update_weight_version",
        UPDATE_VERSION_PATH,
        update_version_body(version),
        check_update_answer,
        timeout_s,
    )


async def read_weight_versions(
    client: EngineClient, urls: Sequence[str], *, timeout_s: float = 10.0
) -> ControlReport:
    """Every engine's ``weight_version`` (``GET /model_info``) in its outcome's
    ``version``; an answer naming no version is an error for that engine."""

    async def call(url: str) -> dict[str, Any]:
        info = await client.get_json(
            url, MODEL_INFO_PATH, timeout_s=timeout_s, retry=False, control=True
        )
        version = model_info_version(info)
        if version is None:
            raise EngineControlError(f"/model_info names no weight_version: {info!r:.200}")
        return {"version": version}

    return await _fan_out("read_weight_versions", urls, call)
