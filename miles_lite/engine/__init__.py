"""The engine layer: an aiohttp client of SGLang engines, its retry policy, and the router.

Usage::

    async with EngineClient(EngineClientConfig()) as client:
        async with Router(urls, client, RouterConfig()) as router:
            async with router.lease() as url:
                raw = await client.post(url, "/rollout/generate", payload, request_id=rid)
"""

from miles_lite.engine.client import EngineClient, EngineClientStats
from miles_lite.engine.client_config import EngineClientConfig
from miles_lite.engine.response import (
    BodyAllocator,
    BodyBuffer,
    BytearrayBuffer,
    RawResponse,
    allocate_bytearray,
)
from miles_lite.engine.retry import RetryPolicy, retry_call
from miles_lite.engine.router import EngineState, Router, RouterConfig, RouterStats

__all__ = [
    "BodyAllocator",
    "BodyBuffer",
    "BytearrayBuffer",
    "EngineClient",
    "EngineClientConfig",
    "EngineClientStats",
    "EngineState",
    "RawResponse",
    "RetryPolicy",
    "Router",
    "RouterConfig",
    "RouterStats",
    "allocate_bytearray",
    "retry_call",
]
