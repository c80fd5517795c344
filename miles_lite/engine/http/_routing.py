"""How a sticky key reaches SGLang's router as a header (see :mod:`miles_lite.engine.smg`).

It travels in a context variable set around ``Router.call``'s ``fn`` (:func:`sticky`) and
read by the client when it sends to the router's URL (:func:`route_headers`): the header
then reaches the one request ``fn`` makes, whatever ``fn`` is (the session server's, a
user's), without changing the ``fn(url)`` contract; the variable is per task, so
concurrent calls never see each other's key. Its own module, below both the client and
the router, so that neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["route_headers", "sticky"]

# (router URL, header name, key) of the Router.call running in this task; see the module doc.
_ROUTE: ContextVar[tuple[str, str, str] | None] = ContextVar("miles_lite_smg_route", default=None)


@contextmanager
def sticky(url: str, header: str, key: str) -> Iterator[None]:
    """Within the block (this task and tasks it starts), requests the client sends to
    the router at ``url`` carry ``header: key``."""
    token = _ROUTE.set((url, header, key))
    try:
        yield
    finally:
        _ROUTE.reset(token)


def route_headers(url: str) -> dict[str, str] | None:
    """The sticky-key header for a request to ``url`` in this task (see :func:`sticky`),
    or ``None``. Pure and cheap: read once per request by the client."""
    route = _ROUTE.get()
    if route is None or route[0] != url:
        return None
    return {route[1]: route[2]}
