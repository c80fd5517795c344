"""The engine layer's HTTP half: one exchange with one engine URL.

The transport seam (:mod:`.transport`; aiohttp's in :mod:`.aiohttp_transport`, with the
in-place body receiver in :mod:`.in_place`; a mock in :mod:`.mock`), the one translation
of transport failures into typed errors (:mod:`._errors`), body reading (:mod:`._body`)
and buffers (:mod:`.response`), the client and its retry loop (:mod:`.client`,
:mod:`._retry`), the sticky-key header (:mod:`._routing`) and the worker-side blocking
exchange of ``fetch_in_parser`` (:mod:`.blocking`). The fleet above it (router, balancer,
health, weight versions, control calls, SGLang's router) lives in :mod:`miles_lite.engine`
itself; nothing here imports it. Public names are exported by :mod:`miles_lite.engine`.

Nothing is imported here: parser workers import :mod:`.blocking` without aiohttp.
"""
