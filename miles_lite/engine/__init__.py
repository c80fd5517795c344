"""The engine layer: an aiohttp client of SGLang engines, its retry policy, and the router.

Usage::

    async with EngineClient(EngineClientConfig()) as client:
        async with Router(urls, client, RouterConfig()) as router:
            async with router.lease() as url:
                raw = await client.post(url, "/rollout/generate", payload, request_id=rid)
"""

from miles_lite.engine.client import EngineClient, EngineClientStats
from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.control import AbortReport, EngineAbort, abort_requests, busy_requests
from miles_lite.engine.response import (
    BodyAllocator,
    BodyBuffer,
    FreshBuffer,
    RawResponse,
    allocate_fresh,
)
from miles_lite.engine.retry import RetryPolicy, retry_call
from miles_lite.engine.router import EngineState, Router, RouterConfig, RouterStats

__all__ = [
    "AbortReport",
    "BodyAllocator",
    "BodyBuffer",
    "EngineAbort",
    "EngineClient",
    "EngineClientConfig",
    "EngineClientStats",
    "EngineState",
    "FreshBuffer",
    "RawResponse",
    "RetryPolicy",
    "Router",
    "RouterConfig",
    "RouterStats",
    "abort_requests",
    "allocate_fresh",
    "busy_requests",
    "retry_call",
]
