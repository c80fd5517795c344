"""The engines' prefix cache after a weight update: :func:`flush_cache`, which waits (with
backoff, within a bound) while an engine cannot flush yet, and the canary that checks a
flush's effect (:func:`plant_cache_canary`, :func:`probe_cache_canary`).

Sent through :mod:`miles_lite.engine.control`'s fan-out: every engine at once, one
:class:`~miles_lite.engine.control.EngineOutcome` each, never raising for an engine's
failure. Why a canary: SGLang 0.5.23 answers 400 when it could not flush, but its 200
comes with a text saying that nothing is done while requests run or wait, the same text
whatever it did; the answer is not the effect. A short prompt cached before the flush and
sent again after it is (``cached_tokens``: 0 once the cache was emptied).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio

from miles_lite.engine.control import ControlReport, _fan_out
from miles_lite.engine.http.client import EngineClient
from miles_lite.errors import EngineControlError, EngineStatusError
from miles_lite.sglang.control import FLUSH_CACHE_PATH
from miles_lite.sglang.generate_wire import (
    GENERATE_PATH,
    build_generate_payload,
    parse_generate_answer,
)

__all__ = ["flush_cache", "plant_cache_canary", "probe_cache_canary"]

#: The canary's prompt: ordinary ids every text vocabulary holds (see plant_cache_canary).
_CANARY_IDS = list(range(100, 116))


async def flush_cache(
    client: EngineClient,
    urls: Sequence[str],
    *,
    timeout_s: float = 30.0,
    initial_delay_s: float = 0.05,
    max_delay_s: float = 1.0,
) -> ControlReport:
    """``POST /flush_cache`` at every engine until it answers 200, within ``timeout_s``.

    SGLang answers 400 while requests run (not paused, or paused ``in_place``): the
    flush is sent again after a wait that doubles from ``initial_delay_s`` up to
    ``max_delay_s`` (never a hot loop), as long as the next attempt fits the bound; then
    the engine's outcome is an :class:`~miles_lite.errors.EngineControlError` saying how
    many attempts were refused. Any other failure (unreachable, timeout, 5xx) ends that
    engine's flush at once. A 200 is checked where it can be (:func:`probe_cache_canary`).
    """

    async def call(url: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        delay = initial_delay_s
        attempts = 0
        while True:
            attempts += 1
            left = deadline - time.monotonic()
            try:
                await client.post(
                    url, FLUSH_CACHE_PATH, {}, timeout_s=max(left, 1e-3), retry=False, control=True
                )
            except EngineStatusError as exc:
                if exc.status != 400:
                    raise
                if time.monotonic() + delay > deadline:
                    raise EngineControlError(
                        f"flush_cache refused {attempts} time(s) within {timeout_s} s"
                        f" (requests still run there: pause them with retract, or let them"
                        f" end); last answer: {exc.body_excerpt!r:.200}",
                        url=url,
                    ) from exc
                await anyio.sleep(delay)
                delay = min(max_delay_s, delay * 2)
                continue
            return {"attempts": attempts}

    return await _fan_out("flush_cache", urls, call)


def _canary_payload(key: str) -> dict[str, Any]:
    payload = build_generate_payload(_CANARY_IDS, {"max_new_tokens": 1, "temperature": 0.0})
    payload["extra_key"] = key
    return payload


async def plant_cache_canary(
    client: EngineClient, urls: Sequence[str], key: str, *, timeout_s: float = 10.0
) -> ControlReport:
    """Put a short prompt in every engine's prefix cache under cache key ``key`` (one
    token generated); :func:`probe_cache_canary` with the same key later tells whether
    the cache was flushed in between. The engines must not be paused (it would wait)."""
    return await _canary("plant_cache_canary", client, urls, key, timeout_s, expect_empty=False)


async def probe_cache_canary(
    client: EngineClient, urls: Sequence[str], key: str, *, timeout_s: float = 10.0
) -> ControlReport:
    """Send the canary of :func:`plant_cache_canary` again: an engine that finds any of
    its prompt tokens cached (``meta_info.cached_tokens``) kept its prefix cache through
    the flush, an error for that engine (``cached_tokens`` in each outcome)."""
    return await _canary("probe_cache_canary", client, urls, key, timeout_s, expect_empty=True)


async def _canary(
    action: str,
    client: EngineClient,
    urls: Sequence[str],
    key: str,
    timeout_s: float,
    *,
    expect_empty: bool,
) -> ControlReport:
    async def call(url: str) -> dict[str, Any]:
        payload = _canary_payload(key)
        rid = payload["rid"]
        answer = await client.post_json(
            url,
            GENERATE_PATH,
            payload,
            request_id=rid,
            timeout_s=timeout_s,
            retry=False,
            control=True,
        )
        cached = parse_generate_answer(answer, rid=rid, url=url).cached_tokens
        if expect_empty and cached:
            raise EngineControlError(
                f"the cache still held {cached} of the canary's {len(_CANARY_IDS)} prompt"
                " tokens after a flush that answered 200: KV computed before the update"
                " may have been reused",
                url=url,
                request_id=rid,
            )
        return {"cached_tokens": cached}

    return await _fan_out(action, urls, call)
