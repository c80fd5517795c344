"""Settings of the engine layer: the client's limits, the retry policy, the router's health
checks and in-flight bound, generation through SGLang's router (:class:`SmgConfig`), and
:class:`EngineConfig`, which a rollout config holds.

Every setting has one owner: a rollout's engine limits live in its ``engines`` field, a
request's limits in :class:`EngineClientConfig` (the worker-side fetch of
``fetch_in_parser`` derives its own from it), the in-flight bound in :class:`RouterConfig`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from miles_lite._core.validate import check_int, check_number, check_seconds, check_type
from miles_lite.errors import ConfigError

__all__ = ["EngineClientConfig", "EngineConfig", "RetryPolicy", "RouterConfig", "SmgConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How many times a retryable engine error is tried again, and how long to wait between.

    Only errors whose ``retryable`` is true are retried: what never reached the engine
    and 502/503/504 answers. The wait before retry ``k`` (1-based) is
    ``min(backoff_max_s, backoff_initial_s * 2**(k-1))``, scaled by a random factor in
    ``[1 - jitter, 1 + jitter]`` and capped at ``backoff_max_s`` again. ``max_attempts``
    counts the first try: 1 means never retry.

    Raises :class:`~miles_lite.errors.ConfigError` naming the field on a bad value.

    Usage: ``RetryPolicy(max_attempts=5, backoff_initial_s=0.2)``.
    """

    #: Tries in all, the first one included (>= 1).
    max_attempts: int = 3
    #: Wait before the first retry, in seconds (>= 0).
    backoff_initial_s: float = 0.1
    #: Longest wait between two tries, in seconds (>= backoff_initial_s).
    backoff_max_s: float = 2.0
    #: Relative random spread of each wait, in [0, 1]: 0.1 means +-10%.
    jitter: float = 0.1

    def __post_init__(self) -> None:
        check_int("RetryPolicy", "max_attempts", self.max_attempts)
        for name in ("backoff_initial_s", "backoff_max_s", "jitter"):
            check_number("RetryPolicy", name, getattr(self, name))
        if self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(
                f"RetryPolicy.backoff_max_s must be >= backoff_initial_s"
                f" ({self.backoff_initial_s!r}), got {self.backoff_max_s!r}"
            )
        if self.jitter > 1:
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter!r}")

    def backoff_s(self, retry: int, rand: float) -> float:
        """The wait in seconds before retry number ``retry`` (1-based).

        ``rand`` is a uniform random number in ``[0, 1)`` that sets the jitter; pure
        function, never blocks.
        """
        if retry < 1:
            raise ValueError(f"retry is 1-based, got {retry!r}")
        # Cap the exponent first: 2**retry overflows a float long before retries run out.
        base = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(retry - 1, 60))
        spread = 1.0 + self.jitter * (2.0 * rand - 1.0)
        return max(0.0, min(self.backoff_max_s, base * spread))

    def retry_delay(
        self, attempt: int, error: BaseException, rand: Callable[[], float]
    ) -> float | None:
        """After try ``attempt`` (1-based) failed with ``error``: the wait in seconds before
        the next try, or ``None`` when there is none (``error`` is not retryable, or
        ``max_attempts`` tries were made). ``rand()`` gives the jitter's uniform number in
        ``[0, 1)``; called only when there is a next try."""
        if attempt >= self.max_attempts or not self.should_retry(error):
            return None
        return self.backoff_s(attempt, rand())

    @staticmethod
    def should_retry(error: BaseException) -> bool:
        """Whether ``error`` may be retried: only when its ``retryable`` attribute is true."""
        return isinstance(error, Exception) and getattr(error, "retryable", False) is True


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineClientConfig:
    """Timeouts, connection limits and body limits of an engine client.

    Every wait is bounded: connecting by ``connect_timeout_s``, every socket read by
    ``read_timeout_s``, the whole exchange (waiting for a free pooled connection, sending,
    receiving the full body) by ``total_timeout_s``. Either of the last two may be ``None``,
    not both. Sizes are in bytes, times in seconds. The same limits bound the exchange a
    parser worker makes itself (``fetch_in_parser``).

    Raises :class:`~miles_lite.errors.ConfigError` naming the field and the bad value.

    Usage: ``EngineClientConfig(total_timeout_s=120.0, max_body_bytes=1 << 30)``.
    """

    #: Time to open a TCP connection to an engine.
    connect_timeout_s: float = 10.0
    #: Longest silence while waiting for any bytes of the answer (headers or body). A
    #: diffusion engine sends nothing until its samples are done: keep this above the
    #: slowest generation. ``None``: only the total timeout bounds the wait.
    read_timeout_s: float | None = 600.0
    #: Whole exchange. ``None`` only when ``read_timeout_s`` is set.
    total_timeout_s: float | None = 1800.0
    #: Open connections across all engines (each of the two pools: generations, and
    #: control calls).
    max_connections: int = 256
    #: Open connections to one engine for generations (<= max_connections).
    max_connections_per_host: int = 64
    #: Connections to one engine kept apart for control calls (pause, weight loads and
    #: versions, cache flushes, aborts, health probes): a control call never waits for a
    #: connection that generations hold (a ``retract`` or ``in_place`` pause keeps them
    #: open until the update it makes room for is done).
    control_connections_per_host: int = 8
    #: Largest body accepted. Larger bodies are refused with ``BodyTooLargeError``: before
    #: reading when Content-Length says so, else as soon as the limit is crossed.
    max_body_bytes: int = 4 << 30
    #: Largest piece read from the socket buffer at a time (also aiohttp's read buffer).
    read_chunk_bytes: int = 1 << 20
    #: Which failures are tried again, and the backoff between tries.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Extra headers sent with every request, as (name, value) pairs (e.g. an
    #: ``Authorization`` for a reward API); a tuple so that the config stays immutable.
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        owner = "EngineClientConfig"
        check_seconds(owner, "connect_timeout_s", self.connect_timeout_s)
        check_seconds(owner, "read_timeout_s", self.read_timeout_s, optional=True)
        check_seconds(owner, "total_timeout_s", self.total_timeout_s, optional=True)
        if self.total_timeout_s is None and self.read_timeout_s is None:
            raise ConfigError(
                f"{owner}.total_timeout_s may be None only when read_timeout_s is set; got"
                " total_timeout_s=None and read_timeout_s=None (a request could hang forever)"
            )
        for name in (
            "max_connections",
            "max_connections_per_host",
            "control_connections_per_host",
            "max_body_bytes",
            "read_chunk_bytes",
        ):
            check_int(owner, name, getattr(self, name))
        if self.max_connections_per_host > self.max_connections:
            raise ConfigError(
                f"{owner}.max_connections_per_host must be <= max_connections"
                f" ({self.max_connections}), got {self.max_connections_per_host!r}"
            )
        check_type(owner, "retry", self.retry, RetryPolicy)
        if not isinstance(self.headers, tuple) or not all(
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(part, str) for part in pair)
            for pair in self.headers
        ):
            raise ConfigError(
                f"{owner}.headers must be a tuple of (name, value) string pairs,"
                f" got {self.headers!r}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class SmgConfig:
    """Generation through SGLang's router (``smg``) at the one URL a rollout is opened on.

    Generations (``/generate``, chat) go to the router, which picks the engine, checks
    its health and balances the load; aborts, pauses, weight updates and ``/v1/loads`` go
    straight to the engines, whose URLs the router's ``GET /workers`` lists (read when the
    rollout opens, and again every ``RouterConfig.health_interval_s``). A sticky key
    (an agent session's) travels as the ``routing_key_header`` header.

    The router must run with ``--disable-retries`` (see
    :func:`~miles_lite.engine.smg.smg_launch_args`): otherwise it sends a generation an
    engine already received to another engine when the first dies or answers 5xx (the
    same rid generated twice), and rewrites ``/generate`` bodies (it drops sampling keys
    such as ``spaces_between_special_tokens`` and rounds floats to 32 bits); with it,
    bodies reach the engine byte for byte. Sticky keys are honoured by its
    ``--policy consistent_hashing`` (or ``manual``).

    Raises :class:`~miles_lite.errors.ConfigError` naming the field on a bad value.

    Usage: ``RouterConfig(max_inflight_per_engine=256, smg=SmgConfig(min_workers=4))``.
    """

    #: Healthy engines the router must list before the rollout opens (>= 1).
    min_workers: int = 1
    #: Longest wait for them when the rollout opens, in seconds; then the open fails with
    #: ``EngineUnavailableError``.
    open_timeout_s: float = 60.0
    #: The header the router reads a sticky key from (its ``--routing-key-headers``);
    #: keys over 128 characters are ignored by smg (routed at random).
    routing_key_header: str = "X-SMG-Routing-Key"

    def __post_init__(self) -> None:
        check_int("SmgConfig", "min_workers", self.min_workers)
        check_seconds("SmgConfig", "open_timeout_s", self.open_timeout_s)
        header = self.routing_key_header
        if (
            not isinstance(header, str)
            or not header
            or not header.isascii()
            or (any(c in header for c in " :\t\r\n"))
        ):
            raise ConfigError(
                f"SmgConfig.routing_key_header must be an HTTP header name, got {header!r}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class RouterConfig:
    """How many requests each engine takes at once, how the router checks engine health,
    and how long a lease may wait (seconds).

    ``max_inflight_per_engine`` has no default: a text engine batches hundreds of requests
    (SGLang's ``--max-running-requests``), a diffusion engine a few, and a silent default
    would be wrong for one of them. The rollout configs carry one fitting their kind.

    Raises :class:`~miles_lite.errors.ConfigError` naming the field on a bad value.

    Usage: ``RouterConfig(max_inflight_per_engine=256, health_interval_s=2.0)``.
    """

    #: Leases open at once on one engine, whoever holds them (every rollout sharing this
    #: router): a lease waits for a free slot. When an engine leaves the rotation, the
    #: others do not take its share. For SGLang, about its ``--max-running-requests``
    #: (plus a queued request or two, so the engine never idles between answers).
    max_inflight_per_engine: int
    #: Time between two rounds of /health probes (every engine, removed ones included).
    health_interval_s: float = 5.0
    #: Consecutive failures (of leases or probes) that take an engine out of rotation.
    failure_threshold: int = 3
    #: Longest wait for one /health answer; no answer in time counts as a failure.
    health_timeout_s: float = 2.0
    #: Longest wait in :meth:`Router.lease` for a healthy engine when none is; then the
    #: call fails once (it is not retried: it already waited).
    wait_timeout_s: float = 60.0
    #: Sticky keys remembered (least recently used ones are forgotten first).
    max_sticky_keys: int = 100_000
    #: Least time out of rotation before a passing /health probe lets an engine back in
    #: (seconds, >= 0). Counted from its removal.
    readmit_cooldown_s: float = 10.0
    #: Generate through SGLang's router (smg) at the one URL given, instead of choosing
    #: among engine URLs (see :class:`SmgConfig`). The router then holds one lease queue
    #: for the front, ``max_inflight_per_engine`` x the healthy engines it lists; health
    #: is its ``/readiness``; which engine serves is smg's choice.
    smg: SmgConfig | None = None
    #: How long opening a rollout waits for its engines to answer ``/health`` (seconds):
    #: a mistyped host or a closed port then fails ``open()`` within seconds, naming the
    #: URLs, instead of every sample after ``wait_timeout_s``. Engines still loading
    #: weights need more (``600.0``); ``None`` does not wait (leases then wait for a
    #: healthy engine up to ``wait_timeout_s``).
    ready_timeout_s: float | None = 5.0
    #: Failed catch-up tries of one engine from one update's source (with backoff
    #: between them) before the fleet gives up: the engine then stays out of rotation
    #: (logged, counted ``catch_up_gave_up``) until the next update, or until it comes
    #: back from a death or hang (which gives it as many tries again).
    max_catch_up_tries: int = 8

    def __post_init__(self) -> None:
        owner = "RouterConfig"
        check_seconds(owner, "readmit_cooldown_s", self.readmit_cooldown_s, zero=True)
        check_seconds(owner, "ready_timeout_s", self.ready_timeout_s, optional=True)
        for name in ("health_interval_s", "health_timeout_s", "wait_timeout_s"):
            check_seconds(owner, name, getattr(self, name))
        for name in (
            "failure_threshold",
            "max_sticky_keys",
            "max_inflight_per_engine",
            "max_catch_up_tries",
        ):
            check_int(owner, name, getattr(self, name))
        if self.smg is not None:
            check_type(owner, "smg", self.smg, SmgConfig)


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    """Everything about the engines of a rollout: the client's request limits and retry
    policy, and the router's in-flight bound and health checks.

    Usage: ``EngineConfig(router=RouterConfig(max_inflight_per_engine=256))``.
    """

    router: RouterConfig
    client: EngineClientConfig = field(default_factory=EngineClientConfig)

    def __post_init__(self) -> None:
        check_type("EngineConfig", "router", self.router, RouterConfig)
        check_type("EngineConfig", "client", self.client, EngineClientConfig)
