"""SGLang's router (``smg``) in front of the engines: generation through it, control around it.

A rollout opened on a router URL with ``RouterConfig(smg=SmgConfig())`` sends its
generations (``/generate``, chat) to the router, which chooses the engine (cache-aware,
power of two, consistent hashing), checks engine health and balances load. The router
serves no control endpoint (``/abort_request``, ``/pause_generation``, weight updates and
``/v1/loads`` answer 404 there), so those go to the engines themselves:
:class:`SmgFront` reads their URLs from the router's ``GET /workers`` when the rollout
opens and at every health round, and :class:`~miles_lite.engine.router.Router` hands them
to :mod:`miles_lite.engine.control`.

A sticky key (an agent session's, given to ``Router.call(fn, key=...)``) must reach the
router as a header: :mod:`miles_lite.engine.http._routing` carries it to the client.

:func:`smg_launch_args` gives the flags miles_lite needs the router to run with, and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from miles_lite.engine.config import RouterConfig, SmgConfig
from miles_lite.errors import (
    ConfigError,
    EngineError,
    EngineProtocolError,
    EngineStatusError,
    EngineUnavailableError,
)

if TYPE_CHECKING:
    from miles_lite.engine.http.client import EngineClient

__all__ = [
    "READINESS_PATH",
    "SMG_FLAGS",
    "WORKERS_PATH",
    "SmgFront",
    "SmgWorker",
    "parse_workers",
    "smg_launch_args",
]

#: The router's worker list.
WORKERS_PATH = "/workers"
#: 200 while the router has a healthy engine, 503 otherwise (its ``/health`` is only
#: liveness: 200 with no engine at all).
READINESS_PATH = "/readiness"
#: Pause between two reads of the worker list while a rollout opens, in seconds.
_OPEN_POLL_S = 0.1
#: The ``smg launch`` flags miles_lite needs, besides addresses and the policy (see
#: :func:`smg_launch_args` for what each is for).
SMG_FLAGS = (
    "--disable-retries",
    "--disable-worker-overload-protection",
    "--worker-startup-check-interval",
    "1",
    "--health-check-interval-secs",
    "2",
    "--health-failure-threshold",
    "2",
    "--health-success-threshold",
    "1",
    "--log-level",
    "warn",
)


@dataclass(frozen=True, slots=True)
class SmgWorker:
    """One engine as the router lists it: its base ``url``, smg's ``id`` (a UUID that
    changes when the engine is registered again), ``healthy`` and ``status`` (``ready``,
    ``not_ready``, ``failed``, ``draining``)."""

    url: str
    id: str
    healthy: bool
    status: str


def parse_workers(answer: Any, url: str) -> tuple[SmgWorker, ...]:
    """The engines in a ``GET /workers`` answer of the router at ``url``, checked.

    Raises :class:`~miles_lite.errors.EngineProtocolError` naming the router and the field
    when the answer is not smg's worker list (a missing or mistyped field, a URL that is
    not ``http(s)://``, the same URL twice): a wrong list would send aborts nowhere.
    """
    workers = answer.get("workers") if isinstance(answer, dict) else None
    if not isinstance(workers, list):
        raise EngineProtocolError(
            f"GET {WORKERS_PATH} answered {answer!r:.200}, not a worker list; is {url} SGLang's"
            " router (smg)?",
            url=url,
        )
    out: list[SmgWorker] = []
    for index, item in enumerate(workers):
        where = f"GET {WORKERS_PATH} workers[{index}]"
        if not isinstance(item, dict):
            raise EngineProtocolError(f"{where} is {item!r:.100}, not an object", url=url)
        fields = {"url": str, "id": str, "is_healthy": bool, "status": str}
        for name, kind in fields.items():
            if not isinstance(item.get(name), kind):
                raise EngineProtocolError(
                    f"{where}.{name} must be a {kind.__name__}, got {item.get(name)!r:.100}",
                    url=url,
                )
        engine_url = item["url"]
        if not engine_url.startswith(("http://", "https://")):
            raise EngineProtocolError(
                f"{where}.url is {engine_url!r}: aborts and weight updates need an http(s)"
                " URL of the engine",
                url=url,
            )
        out.append(SmgWorker(engine_url, item["id"], item["is_healthy"], item["status"]))
    seen = [w.url for w in out]
    twice = sorted({u for u in seen if seen.count(u) > 1})
    if twice:
        raise EngineProtocolError(f"GET {WORKERS_PATH} lists {twice} more than once", url=url)
    return tuple(out)


class SmgFront:
    """What a :class:`~miles_lite.engine.router.Router` knows of the smg router at ``url``:
    the engines behind it (:attr:`workers`) and whether it can serve (its ``/readiness``).

    Not a resource of its own: the router runs :meth:`run` in its task group.
    """

    def __init__(self, urls: Sequence[str], client: EngineClient, config: RouterConfig) -> None:
        if isinstance(urls, str) or len(urls) != 1:
            raise ConfigError(
                "RouterConfig.smg is set: give exactly one URL, SGLang's router's"
                f" (the engines are read from its {WORKERS_PATH}), got {urls!r}"
            )
        if config.smg is None:
            raise ConfigError("SmgFront needs RouterConfig.smg")
        self.url: str = urls[0]
        self.smg: SmgConfig = config.smg
        self._client = client
        self._config = config
        #: The engines as the router listed them last (empty before the first read).
        self.workers: tuple[SmgWorker, ...] = ()
        #: Reads of the worker list that failed (the last good list is kept).
        self.refresh_failures = 0
        #: Why the last read failed, or None.
        self.last_error: str | None = None

    @property
    def engine_urls(self) -> tuple[str, ...]:
        """Every listed engine's URL (healthy or not), as the router lists them."""
        return tuple(w.url for w in self.workers)

    @property
    def healthy_urls(self) -> tuple[str, ...]:
        """The URLs of the engines the router reports healthy."""
        return tuple(w.url for w in self.workers if w.healthy)

    async def refresh(self) -> tuple[SmgWorker, ...]:
        """Read the worker list once (bounded by ``health_timeout_s``, no retry).

        Raises the client's engine errors, and ``EngineProtocolError`` for an answer that
        is not a worker list; on success :attr:`workers` holds it.
        """
        answer = await self._client.get_json(
            self.url,
            WORKERS_PATH,
            timeout_s=self._config.health_timeout_s,
            retry=False,
            control=True,
        )
        self.workers = parse_workers(answer, self.url)
        self.last_error = None
        return self.workers

    async def add_worker(self, url: str) -> None:
        """Register the engine at ``url`` with the router (``POST /workers``; smg checks its
        health in the background, then routes to it). A worker smg still drains at that URL
        (for about 5 s after its removal) answers 409: tried again every
        ``_OPEN_POLL_S`` x 5 until it is gone, at most ``SmgConfig.open_timeout_s``;
        already listed and not draining: nothing to do. Raises the client's engine
        errors."""
        timeout_s = self._config.health_timeout_s
        deadline = time.monotonic() + self.smg.open_timeout_s
        while True:
            try:
                await self._client.post_json(
                    self.url,
                    WORKERS_PATH,
                    {"url": url},
                    timeout_s=timeout_s,
                    retry=False,
                    control=True,
                )
                return
            except EngineStatusError as exc:
                if exc.status != 409 or time.monotonic() >= deadline:
                    raise
            with anyio.fail_after(timeout_s):
                await self.refresh()
            if any(w.url == url and w.status != "draining" for w in self.workers):
                return
            await anyio.sleep(_OPEN_POLL_S * 5)

    async def remove_worker(self, url: str) -> bool:
        """Take the engine at ``url`` off the router (``DELETE /workers/{id}``): smg routes
        it no new request (it lists it ``draining``, then forgets it); the requests it
        holds go on. False when the router does not list it. Raises the client's engine
        errors."""
        timeout_s = self._config.health_timeout_s
        with anyio.fail_after(timeout_s):
            await self.refresh()
        ids = [w.id for w in self.workers if w.url == url and w.status != "draining"]
        for worker_id in ids:
            await self._client.delete_json(
                self.url, f"{WORKERS_PATH}/{worker_id}", timeout_s=timeout_s
            )
        return bool(ids)

    async def wait_ready(self) -> None:
        """Wait until the router lists ``min_workers`` healthy engines, at most
        ``open_timeout_s``; raises ``EngineUnavailableError`` (not retryable) saying what
        it saw, or the ``EngineProtocolError`` of an answer that is not a worker list.
        Cancellation propagates."""
        smg = self.smg
        deadline = time.monotonic() + smg.open_timeout_s
        while True:
            try:
                await self.refresh()
            except EngineProtocolError:
                raise  # not smg, or smg changed its answer: waiting will not help
            except EngineError as exc:
                self.last_error = str(exc)
            if len(self.healthy_urls) >= smg.min_workers:
                return
            if time.monotonic() >= deadline:
                seen = (
                    f"the last read failed: {self.last_error}"
                    if self.last_error
                    else f"it lists {[(w.url, w.status) for w in self.workers]}"
                )
                raise EngineUnavailableError(
                    f"SGLang's router at {self.url} has not listed {smg.min_workers} healthy"
                    f" engine(s) within {smg.open_timeout_s} s (SmgConfig.open_timeout_s):"
                    f" {seen}; start the engines, or check its --worker-urls",
                    url=self.url,
                )
            await anyio.sleep(_OPEN_POLL_S)

    async def run(self, on_round: Callable[[bool], None]) -> None:
        """Forever (until cancelled), every ``health_interval_s``: probe ``/readiness``,
        read the worker list again (a failed read keeps the last one), then call
        ``on_round(ready)``."""
        config = self._config
        while True:
            ready = False
            with anyio.move_on_after(config.health_timeout_s):
                ready = await self._client.health(
                    self.url, path=READINESS_PATH, timeout_s=config.health_timeout_s
                )
            try:
                with anyio.fail_after(config.health_timeout_s):
                    await self.refresh()
            except (EngineError, TimeoutError) as exc:
                self.refresh_failures += 1
                self.last_error = str(exc) or type(exc).__name__
            on_round(ready)
            await anyio.sleep(config.health_interval_s)


def smg_launch_args(
    worker_urls: Sequence[str],
    *,
    host: str = "0.0.0.0",
    port: int = 30000,
    prometheus_port: int = 29000,
    policy: str = "consistent_hashing",
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments of ``smg`` (after the program name) for a router miles_lite can
    generate through: ``["smg", *smg_launch_args(urls)]`` or ``[python, "-m", "smg",
    *smg_launch_args(urls)]``. ``extra`` is appended (``--api-key``, ``--log-json``...).

    What each flag is for:

    - ``--disable-retries``: smg would otherwise send a generation an engine already
      received to another engine when the first one dies, drops the connection or answers
      5xx (a rid generated twice), and re-serialise every ``/generate`` body to make that
      possible (dropping sampling keys it does not know, among them
      ``spaces_between_special_tokens``, and rounding floats to 32 bits). With it, each
      request is delivered once and its body unchanged; miles_lite retries only what
      smg says never reached an engine.
    - ``--policy consistent_hashing``: the policy that honours the routing key header, so
      every turn of an agent session lands on one engine (its prefix cache).
    - ``--disable-worker-overload-protection``: otherwise a key moves off an engine that
      reports 8 or more waiting requests, which an RL rollout always has.
    - ``--worker-startup-check-interval 1``: an engine that starts after the router is
      registered within a second, not 30.
    - ``--health-check-interval-secs 2 --health-failure-threshold 2
      --health-success-threshold 1``: a dead engine leaves the rotation in about 4 s,
      not 3 minutes.
    - ``--prometheus-port``: its metrics port; two routers on one host need two.
    - ``--log-level warn``: ``info`` writes two lines per request.
    """
    if isinstance(worker_urls, str):
        raise ConfigError(f"worker_urls must be a sequence of URLs, got the string {worker_urls!r}")
    return [
        "launch",
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-port",
        str(prometheus_port),
        *(["--worker-urls", *worker_urls] if worker_urls else []),
        "--policy",
        policy,
        *SMG_FLAGS,
        *extra,
    ]
