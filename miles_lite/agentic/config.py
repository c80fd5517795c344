"""Settings, handles and counters of the session server."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from miles_lite._core.validate import check_int, check_seconds, check_type
from miles_lite.errors import ConfigError

__all__ = ["LOOPBACK_HOSTS", "Session", "SessionServerConfig", "SessionServerStatistics"]

#: Hosts that only this machine reaches.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, kw_only=True)
class SessionServerConfig:
    """How the session server listens, forwards and guards itself. Sizes in bytes, times
    in seconds.

    - ``host``/``port``: where it listens (``port=0``: a free one). On loopback (the
      default) it refuses requests whose ``Host`` is not loopback (a web page's DNS
      rebinding); bound elsewhere, sessions are reached only with their API key
      (``Authorization: Bearer``), never by URL, and the server says so when it starts.
    - ``max_body_bytes``: an agent's request body at most (413 beyond).
    - ``header_timeout_s``: a connection that has not sent a request's headers (or stays
      idle between requests) this long is closed; ``body_timeout_s``: a body not read
      whole in this time is refused (408). Slow clients cannot hold connections or
      sessions.
    - ``idle_ttl_s``: a session no request touched this long is closed and its records
      dropped (an agent that never closes its session).
    - ``token_in``: after a session's first turn, send the engine the trajectory's own ids
      plus the tokens of the appended messages (``input_ids``), so the model's earlier
      output is never re-tokenized; an agent that rewrites its history is templated anew
      (a new sample). ``max_trim_tokens``: trailing output tokens a re-templated turn
      may drop and still extend the trajectory (a stop token the template renders
      otherwise).
    - ``engine_timeout_s``: one forwarded chat request at most (``None``: the engine
      client's own total timeout); ``abort_timeout_s``: the abort of a rid whose agent
      went away or timed out.
    - ``model``: what ``/v1/models`` lists.
    - ``processes``: where agents' requests are served. ``N >= 1``: in N worker
      processes of the server's own, each on its own loopback port (a session's
      ``base_url`` names its worker's), so the agents' HTTP parsing, body checks,
      templating, token in and answer writing stay off the rollout's loop; the engine
      sends stay in the rollout's process (one send path). ``"auto"`` (the default): one
      worker per core beyond the rollout's, 1 to 4 (:attr:`worker_count`): at least one
      on any machine, so the default always keeps agents' turns off the rollout's loop.
      ``0``: in the rollout's own process and event loop, the explicit choice for
      notebooks, tests and a few agents (a worker costs seconds to start: it imports the
      library and unpickles the tokenizer).
    - ``start_timeout_s``: a worker process that has not started serving this long
      after it was started fails the server's start (spawning one imports the library
      and unpickles the tokenizer: 2-5 s on a loaded machine).

    Usage: ``SessionServerConfig(max_body_bytes=4 << 20, idle_ttl_s=600)``;
    ``SessionServerConfig(processes=0)`` for agents served in the rollout's process.
    """

    host: str = "127.0.0.1"
    port: int = 0
    max_body_bytes: int = 16 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_ttl_s: float = 300.0
    token_in: bool = True
    max_trim_tokens: int = 1
    engine_timeout_s: float | None = None
    abort_timeout_s: float = 2.0
    model: str = "miles-lite"
    processes: int | Literal["auto"] = "auto"
    start_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        owner = "SessionServerConfig"
        check_type(owner, "host", self.host, str)
        check_int(owner, "port", self.port, minimum=0)
        if self.port > 65535:
            raise ConfigError(f"{owner}.port must be in [0, 65535], got {self.port!r}")
        check_int(owner, "max_body_bytes", self.max_body_bytes, minimum=1024)
        for name in ("header_timeout_s", "body_timeout_s", "idle_ttl_s", "abort_timeout_s"):
            check_seconds(owner, name, getattr(self, name))
        check_seconds(owner, "engine_timeout_s", self.engine_timeout_s, optional=True)
        check_type(owner, "token_in", self.token_in, bool)
        check_int(owner, "max_trim_tokens", self.max_trim_tokens, minimum=0)
        check_type(owner, "model", self.model, str)
        if self.processes != "auto":
            if isinstance(self.processes, bool) or not isinstance(self.processes, int):
                raise ConfigError(
                    f"{owner}.processes must be an int >= 0 or 'auto' (worker processes"
                    f" serving the agents; 0: in the rollout's process), got {self.processes!r}"
                )
            check_int(owner, "processes", self.processes, minimum=0)
        check_seconds(owner, "start_timeout_s", self.start_timeout_s)

    @property
    def worker_count(self) -> int:
        """How many worker processes serve the agents (0: in the rollout's process):
        ``processes``, with ``"auto"`` one per core beyond the rollout's own, at least 1
        and at most 4 (more rarely pays: the engine sends stay in the rollout's process).

        ``"auto"`` is 1 on a machine of 1 or 2 cores, never 0: the worker shares a core
        with the rollout there, but the agents' parsing and templating no longer hold the
        rollout's loop between its steps, and the rollout's process spends less CPU a turn
        (README "Agents"). On two cores the turns/s are not higher for it: the worker's
        CPU comes from the same two cores (README "Text layer benchmark")."""
        if self.processes == "auto":
            return max(1, min(4, (os.cpu_count() or 1) - 1))
        return self.processes

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the server."""
        return self.host in LOOPBACK_HOSTS


@dataclass(frozen=True, slots=True)
class Session:
    """An open session: its ``id``, the ``base_url`` an OpenAI client takes, and
    ``api_key``, which picks the session at the server's ``/v1`` (the only way in when the
    server is not on loopback: then ``base_url`` is that ``/v1``)."""

    id: str
    base_url: str
    api_key: str

    @property
    def anthropic_base_url(self) -> str:
        """The base URL an ``anthropic`` client takes (it appends ``/v1/messages``); its
        ``api_key`` is :attr:`api_key`."""
        return self.base_url.removesuffix("/v1")


@dataclass(frozen=True, slots=True)
class SessionServerStatistics:
    """Counters of a :class:`SessionServer` since it started.

    ``refused``: agent requests answered 4xx for what they held (bad JSON, a key the
    rollout sets, ``n`` != 1, ...); ``unauthorized``: management or chat requests without
    the right credential or ``Host``; ``expired``: sessions closed after ``idle_ttl_s``;
    ``token_in_turns`` / ``templated_turns``: turns sent as the trajectory's ids / as
    messages the engine templated; ``worker_exits``: worker processes (``processes``)
    that died while the server ran (each is replaced; the agents of its sessions lose
    their connection); ``worker_gc_collections``: garbage collections the worker processes
    ran since they started (0 in-process: the rollout's process is its user's).
    """

    open_sessions: int
    opened: int
    closed: int
    expired: int
    requests: int
    recorded: int
    token_in_turns: int
    templated_turns: int
    engine_errors: int
    conflicts: int
    not_found: int
    refused: int
    unauthorized: int
    too_large: int
    aborted_answers: int
    disconnect_aborts: int
    timeout_aborts: int
    worker_exits: int
    worker_gc_collections: int


#: The counters a :class:`~miles_lite.agentic.http_io.Refused` answer may count in.
RefusalCounter = Literal[
    "refused", "unauthorized", "too_large", "not_found", "conflicts", "engine_errors"
]


@dataclass(slots=True, kw_only=True)
class SessionCounters:
    """The running counts of a :class:`SessionServer`, one record its edge, token-in half
    and forwarder add to (a misspelled counter is an ``AttributeError``, not a new key);
    :meth:`snapshot` is what ``statistics()`` returns. Fields as in
    :class:`SessionServerStatistics`."""

    opened: int = 0
    closed: int = 0
    expired: int = 0
    requests: int = 0
    recorded: int = 0
    token_in_turns: int = 0
    templated_turns: int = 0
    engine_errors: int = 0
    conflicts: int = 0
    not_found: int = 0
    refused: int = 0
    unauthorized: int = 0
    too_large: int = 0
    aborted_answers: int = 0
    disconnect_aborts: int = 0
    timeout_aborts: int = 0
    worker_exits: int = 0
    worker_gc_collections: int = 0

    def count_refusal(self, counter: RefusalCounter) -> None:
        """One more in the counter a refused request names."""
        setattr(self, counter, getattr(self, counter) + 1)

    def snapshot(self, open_sessions: int) -> SessionServerStatistics:
        """The counts now, with the number of sessions open."""
        return SessionServerStatistics(open_sessions=open_sessions, **dataclasses.asdict(self))

    def values(self) -> list[int]:
        """The counts in field order (what a worker process reports)."""
        return list(dataclasses.astuple(self))

    def plus(self, *reported: Sequence[int]) -> SessionCounters:
        """These counts plus others in field order (:meth:`values`): the server's total
        over its worker processes."""
        totals = self.values()
        for values in reported:
            totals = [a + b for a, b in zip(totals, values, strict=True)]
        return SessionCounters(**dict(zip(_COUNTER_NAMES, totals, strict=True)))


_COUNTER_NAMES = tuple(f.name for f in dataclasses.fields(SessionCounters))
