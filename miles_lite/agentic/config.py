"""Settings, handles and counters of the session server."""

from __future__ import annotations

from dataclasses import dataclass

from miles_lite.errors import ConfigError

__all__ = ["Session", "SessionServerConfig", "SessionServerStatistics"]


@dataclass(frozen=True, kw_only=True)
class SessionServerConfig:
    """How the session server listens and forwards. Sizes in bytes, times in seconds.

    ``port=0`` takes a free port. ``max_body_bytes`` bounds an agent's request body (413
    beyond). ``engine_timeout_s`` bounds one forwarded chat request (``None``: the engine
    client's own total timeout). ``abort_timeout_s`` bounds the abort of a rid whose agent
    went away. ``model`` is what ``/v1/models`` lists.

    Usage: ``SessionServerConfig(max_body_bytes=4 << 20)``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    max_body_bytes: int = 16 << 20
    engine_timeout_s: float | None = None
    abort_timeout_s: float = 2.0
    model: str = "miles-lite"

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ConfigError(f"port must be an int in [0, 65535], got {self.port!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be an int >= 1024, got {self.max_body_bytes!r}")
        if self.engine_timeout_s is not None and not self.engine_timeout_s > 0:
            raise ConfigError(
                f"engine_timeout_s must be > 0 or None, got {self.engine_timeout_s!r}"
            )
        if not self.abort_timeout_s > 0:
            raise ConfigError(f"abort_timeout_s must be > 0, got {self.abort_timeout_s!r}")


@dataclass(frozen=True, slots=True)
class Session:
    """An open session: its ``id``, the ``base_url`` an OpenAI client takes
    (``.../sessions/<id>/v1``), and ``api_key``, which picks the same session at the
    server's fixed :attr:`SessionServer.openai_base_url`."""

    id: str
    base_url: str
    api_key: str


@dataclass(frozen=True, slots=True)
class SessionServerStatistics:
    """Counters of a :class:`SessionServer` since it started."""

    open_sessions: int
    opened: int
    closed: int
    requests: int
    recorded: int
    engine_errors: int
    conflicts: int
    not_found: int
    bad_requests: int
    too_large: int
    aborted_answers: int
    disconnect_aborts: int
