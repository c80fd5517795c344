"""The engine layer: every byte to and from an engine.

Two layers. :mod:`miles_lite.engine.http`, one exchange with one URL: a transport seam
(:class:`AsyncTransport`: aiohttp, or :class:`MockTransport` in unit tests; the
worker-side exchange of ``fetch_in_parser`` in :mod:`miles_lite.engine.http.blocking`),
one translation of transport failures into typed errors, the client, the router (the one
retry loop: only what never reached an engine, or a 502/503/504, is sent again; the
version gate of engines that missed a weight update; the record of weight versions) and
the one sender of control calls (aborts, pauses, weight updates, cache flushes), at the
top of this package: the fleet of engines. The router may also generate through SGLang's own router (:class:`SmgConfig`,
:mod:`miles_lite.engine.smg`), still aborting and controlling at the engines.

Usage::

    async with EngineClient(EngineClientConfig()) as client:
        async with Router(urls, client, RouterConfig(max_inflight_per_engine=64)) as router:
            raw = await router.post("/generate", payload, request_id=rid)
"""

from miles_lite._core.lazy import lazy_exports as _lazy_exports

# Imported when first used: parser workers import the blocking exchange of
# fetch_in_parser (engine.http.blocking) and need neither aiohttp nor the router.
_EXPORTS: dict[str, list[str]] = {
    "miles_lite.engine.balancer": [
        "EngineState",
    ],
    "miles_lite.engine.cache_control": [
        "flush_cache",
        "plant_cache_canary",
        "probe_cache_canary",
    ],
    "miles_lite.engine.http.client": [
        "EngineClient",
        "EngineClientStatistics",
    ],
    "miles_lite.engine.config": [
        "EngineClientConfig",
        "EngineConfig",
        "RetryPolicy",
        "RouterConfig",
        "SmgConfig",
    ],
    "miles_lite.engine.control": [
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
    ],
    "miles_lite.engine.http.response": [
        "BodyAllocator",
        "BodyBuffer",
        "FreshBuffer",
        "RawResponse",
        "allocate_fresh",
    ],
    "miles_lite.engine.router": [
        "Router",
        "RouterStatistics",
    ],
    "miles_lite.engine.smg": [
        "SmgWorker",
        "smg_launch_args",
    ],
    "miles_lite.engine.http.aiohttp_transport": [
        "AiohttpTransport",
    ],
    "miles_lite.engine.http.mock": [
        "MockFailure",
        "MockResponse",
        "MockTransport",
    ],
    "miles_lite.engine.http.transport": [
        "AsyncTransport",
    ],
    "miles_lite.engine.versions": [
        "VersionRecord",
        "WeightVersions",
    ],
}
__getattr__, __dir__, __all__ = _lazy_exports(__name__, _EXPORTS)
