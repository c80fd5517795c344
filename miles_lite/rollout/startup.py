"""Start-up steps said out loud: what a rollout's ``open()`` is doing, and how long it took.

Starting a rollout can take a while on a loaded machine (worker processes importing
torch, engines still loading): each step is logged when it starts and when it is done
(logger ``miles_lite.startup``, level INFO), so a command line or a notebook that shows
INFO never waits without a word.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["startup_step"]

_log = logging.getLogger("miles_lite.startup")


@contextmanager
def startup_step(what: str) -> Iterator[None]:
    """Log ``what`` ... when the block starts, and ``what``: done in N s when it ends
    (failed in N s if it raises)."""
    _log.info("%s ...", what)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        _log.info("%s: failed after %.1f s", what, time.monotonic() - started)
        raise
    _log.info("%s: done in %.1f s", what, time.monotonic() - started)
