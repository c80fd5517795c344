"""Whether engines serve: what :meth:`~miles_lite.engine.router.Router.wait_ready` asks
of an engine whose ``/health`` failed (does anything listen there?) and the error it
raises when no engine answered."""

from __future__ import annotations

import dataclasses
import urllib.parse

import anyio

from miles_lite.engine.config import RouterConfig
from miles_lite.errors import EngineNotReadyError

__all__ = ["SHORT_READY_WAIT_S", "not_ready", "refuses"]


#: The longest ready wait that only checks that engines already serve (RouterConfig's
#: default): within it, a refused connection is final.
SHORT_READY_WAIT_S: float = next(
    float(f.default)  # type: ignore[arg-type]
    for f in dataclasses.fields(RouterConfig)
    if f.name == "ready_timeout_s"
)


async def refuses(url: str) -> bool:
    """Whether nothing listens at ``url``'s host and port: every address refuses a TCP
    connection (asked after its ``/health`` failed, to tell "not there" from "busy")."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        stream = await anyio.connect_tcp(parts.hostname or "", port)
    except OSError as exc:
        # anyio tries every address, then raises OSError from the last one's error (or
        # from a group of them).
        cause = exc if isinstance(exc, ConnectionRefusedError) else exc.__cause__
        causes = getattr(cause, "exceptions", (cause,))
        return all(isinstance(e, ConnectionRefusedError) for e in causes)
    await stream.aclose()
    return False


def not_ready(
    silent: tuple[str, ...], refused: tuple[str, ...], timeout_s: float
) -> EngineNotReadyError:
    """The error of a ready wait no engine answered."""
    quiet = [u for u in silent if u not in refused]
    said = []
    if refused:
        said.append(f"nothing listens at {', '.join(refused)} (connection refused on /health)")
    if quiet:
        said.append(f"no answer to /health within {timeout_s:g} s from {', '.join(quiet)}")
    return EngineNotReadyError(
        "; ".join(said) + "; check the URLs and that the servers run (an engine still"
        " loading weights refuses connections, then answers 503: wait for it with"
        " RouterConfig(ready_timeout_s=600))",
        urls=silent,
        refused=refused,
        timeout_s=timeout_s,
    )
