"""Every exception miles_lite raises, in one tree.

::

    MilesLiteError
    ├── ConfigError (also ValueError)        bad configuration value
    │   └── SamplingParamsError              a sampling key SGLang would refuse
    ├── ClosedResourceError (also anyio's)   use of a pool/client/arena outside its open state
    ├── EventLoopError (also RuntimeError)   run_sync called where an event loop runs: await
    ├── EngineError                          talking to an inference engine
    │   ├── EngineUnavailableError           refused (retryable) / reset after sending
    │   │   └── EngineNotReadyError          no engine answered /health within the ready wait
    │   ├── EngineTimeoutError               connect timeout (retryable) / no answer
    │   ├── EngineStatusError                non-2xx answer (retryable on 502/503/504)
    │   ├── EngineProtocolError              answer not in the wire format (truncated, ...)
    │   │   └── BodyTooLargeError            body over the configured limit: refused
    │   └── EngineControlError               a pause, weight update or flush failed at engines
    ├── CodecError                           a body that does not decode
    ├── ArenaError                           shared-memory arena misuse or exhaustion
    │   └── ArenaFullError                   no room within the wait (rollouts spill instead)
    ├── WorkerError                          a pool worker failed
    │   ├── WorkerCrashedError               the worker process died
    │   ├── WorkerTimeoutError               a call ran past its timeout: worker replaced
    │   └── WorkerTaskError                  the function raised; carries the remote traceback
    ├── RewardError                          a reward function failed
    ├── FilterError                          a dynamic filter raised: its group is dropped
    ├── GenerateError                        a generate function raised
    │   ├── SampleInvariantError             a sample's per-token lists do not line up
    │   ├── ToolError                        a tool raised or timed out (multi-turn)
    │   └── AgentError                       a custom agent raised (traceback kept)
    ├── SessionError                         a chat session is unknown or closed
    └── JournalError                         the rollout journal: other run, corrupt, full

    UserWarning
    └── RolloutWarning                       a rollout kept none of the groups it was asked for

Errors about a request carry ``url`` and ``request_id`` (``None`` when unknown) and say
them in their message. ``retryable`` is what the retry policy reads: ``False`` unless the
transport knows that nothing reached the engine (the one translator in
``miles_lite.engine`` sets it on the instance), or the engine answered 502/503/504
(``EngineStatusError``, from its status code). A generation is never sent twice.
Cancellation is never caught, wrapped or logged.
"""

from __future__ import annotations

import anyio

__all__ = [
    "AgentError",
    "ArenaError",
    "ArenaFullError",
    "BodyTooLargeError",
    "ClosedResourceError",
    "CodecError",
    "ConfigError",
    "EngineControlError",
    "EngineError",
    "EngineNotReadyError",
    "EngineProtocolError",
    "EngineStatusError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "EventLoopError",
    "FilterError",
    "GenerateError",
    "JournalError",
    "MilesLiteError",
    "RewardError",
    "RolloutWarning",
    "SampleInvariantError",
    "SamplingParamsError",
    "SessionError",
    "ToolError",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTaskError",
    "WorkerTimeoutError",
]

RETRYABLE_STATUSES = frozenset({502, 503, 504})


def _where(url: str | None, request_id: str | None) -> str:
    parts = []
    if url:
        parts.append(f"engine {url}")
    if request_id:
        parts.append(f"request {request_id}")
    return f" ({', '.join(parts)})" if parts else ""


class MilesLiteError(Exception):
    """Raised when miles_lite fails: the base of every error it raises.

    ``url`` and ``request_id`` say where it happened, when known.
    """

    retryable: bool = False

    def __init__(
        self, message: str, *, url: str | None = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.request_id = request_id

    def __str__(self) -> str:
        return self.message + _where(self.url, self.request_id)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keyword-only fields must survive the trip back from a pool worker.
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def with_context(
        self, *, url: str | None = None, request_id: str | None = None
    ) -> MilesLiteError:
        """Fill in ``url``/``request_id`` where they are still unknown; returns self."""
        if self.url is None:
            self.url = url
        if self.request_id is None:
            self.request_id = request_id
        return self


def _rebuild(cls: type[MilesLiteError], message: str, state: dict[str, object]) -> MilesLiteError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class ConfigError(MilesLiteError, ValueError):
    """Raised when a configuration value is invalid; the message names the field.

    Usage: ``DiffusionRolloutConfig(microgroup_size=0)`` raises ``ConfigError``.
    """


class SamplingParamsError(ConfigError):
    """Raised when sampling parameters hold a key SGLang refuses; nothing was sent.

    Usage: ``check_sampling_params({"max_tokens": 8})`` raises it, naming the key.
    """


class EventLoopError(MilesLiteError, RuntimeError):
    """Raised when :func:`~miles_lite.run_sync` is called in a thread whose event loop is
    running (a Jupyter cell, async code): it would block that loop, and a stand-in or a
    server the loop serves would never answer. ``await`` the function there instead.

    Usage: in a notebook cell, ``result = await main()``, not ``run_sync(main)``.
    """


class ClosedResourceError(MilesLiteError, anyio.ClosedResourceError):
    """Raised when a pool, client, router, server or arena is used before it is opened or
    after ``aclose()``; also an ``anyio.ClosedResourceError``."""


class EngineError(MilesLiteError):
    """Raised when an exchange with an inference engine fails."""


class EngineUnavailableError(EngineError):
    """Raised when the engine cannot be reached or drops the connection, or no engine is
    healthy within the router's wait.

    Retryable only when the request never reached the engine (refused, DNS, no route):
    a reset after the request went out is not retried, so that no generation runs twice.
    """


class EngineNotReadyError(EngineUnavailableError):
    """Raised when no engine of a router answered ``/health`` within its ready wait
    (``RouterConfig.ready_timeout_s``), so the rollout could not open.

    ``urls``: the engines that did not answer; ``refused``: those of them where nothing
    listens (the connection was refused); ``timeout_s``: the wait, in seconds. A front
    end says it in its own words (the CLI names ``--wait-for-engines``).

    Usage: ``except EngineNotReadyError as exc: print(exc.refused)``.
    """

    def __init__(
        self,
        message: str,
        *,
        urls: tuple[str, ...],
        refused: tuple[str, ...] = (),
        timeout_s: float,
    ) -> None:
        super().__init__(message)
        self.urls = urls
        self.refused = refused
        self.timeout_s = timeout_s


class EngineTimeoutError(EngineError):
    """Raised when the engine does not answer within the configured timeout.

    Retryable only for a connect timeout: once the request went out, the engine may be
    generating, and a retry would run the generation twice.
    """


class EngineStatusError(EngineError):
    """Raised when the engine answers with a non-2xx status.

    ``status`` is the HTTP status, ``body_excerpt`` the start of the answer. Retryable
    only for 502, 503 and 504.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        body_excerpt: str = "",
        url: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, url=url, request_id=request_id)
        self.status = status
        self.body_excerpt = body_excerpt
        self.retryable = status in RETRYABLE_STATUSES


class EngineProtocolError(EngineError):
    """Raised when an answer breaks the wire format (truncated body, wrong content type)."""


class BodyTooLargeError(EngineProtocolError):
    """Raised when a response body exceeds the configured limit; it is refused unread."""


class EngineControlError(EngineError):
    """Raised when a control call (pause, continue, weight update, version bump, cache
    flush) failed at one or more engines.

    ``failures`` maps each failing engine's URL to its typed error (``url`` is the first
    of them); the engines not named took the call.

    Usage: ``report.raise_for_failures()`` raises it after a fan-out.
    """

    def __init__(
        self,
        message: str,
        *,
        failures: dict[str, EngineError] | None = None,
        url: str | None = None,
        request_id: str | None = None,
    ) -> None:
        failures = dict(failures or {})
        super().__init__(message, url=url or next(iter(failures), None), request_id=request_id)
        self.failures = failures


class CodecError(MilesLiteError):
    """Raised when a body does not decode; ``path`` names the field, ``offset`` the byte."""

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        offset: int | None = None,
        url: str | None = None,
        request_id: str | None = None,
    ) -> None:
        if path:
            message = f"{message} at {path}"
        if offset is not None:
            message = f"{message} (byte {offset})"
        super().__init__(message, url=url, request_id=request_id)
        self.path = path
        self.offset = offset


class ArenaError(MilesLiteError):
    """Raised when the shared-memory arena cannot serve an allocation (too large, closed)."""


class ArenaFullError(ArenaError):
    """Raised when the arena has no room for an allocation within ``ArenaConfig.wait_s``.

    Rollouts do not fail on it: the body spills to private memory (a slower hand-off).
    """


class WorkerError(MilesLiteError):
    """Raised when a pool worker fails."""


class WorkerCrashedError(WorkerError):
    """Raised when a worker process dies while running a call; the worker is replaced."""


class WorkerTimeoutError(WorkerError):
    """Raised when a call runs past its timeout in a worker; the worker is killed and
    replaced, so that a hung function never holds a worker (or a rollout) for good.

    Usage: ``await pool.run(fn, timeout_s=300.0)`` raises it after 300 s.
    """


class WorkerTaskError(WorkerError):
    """Raised when a function raised inside a worker; ``remote_traceback`` holds its trace."""

    def __init__(
        self,
        message: str,
        *,
        remote_traceback: str = "",
        url: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, url=url, request_id=request_id)
        self.remote_traceback = remote_traceback


class RewardError(MilesLiteError):
    """Raised when a reward function fails or returns the wrong number of scores."""


class FilterError(MilesLiteError):
    """Raised when a dynamic filter raises; its group is dropped (reason ``filter_error``).

    The filter's own exception is the ``__cause__``.
    """


class GenerateError(MilesLiteError):
    """Raised when a generate function fails with an exception that is not a MilesLiteError.

    The function's own exception is the ``__cause__``, with its traceback.
    """


class SampleInvariantError(GenerateError):
    """Raised when a text sample breaks miles' invariants (per-token lists that do not have
    ``response_length`` entries); the sample fails, the rollout goes on."""


class ToolError(GenerateError):
    """Raised when a tool of a multi-turn sample raises or runs past its timeout; the
    sample fails with the tool's name and the cause kept."""


class AgentError(GenerateError):
    """Raised when a custom agent (agentic rollouts) raises; its sample fails.

    ``agent_traceback`` holds the agent's formatted traceback; its exception is the
    ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        *,
        agent_traceback: str = "",
        url: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, url=url, request_id=request_id)
        self.agent_traceback = agent_traceback


class SessionError(MilesLiteError):
    """Raised when a chat session is used that is unknown or already closed.

    Usage: ``await server.close_session("nope")`` raises it, naming the session id.
    """


class JournalError(MilesLiteError):
    """Raised when the rollout journal cannot be trusted or written: a file from another
    run (the message names the config field or prompt id that differs), a torn or corrupt
    file, a full disk (or ``max_bytes``) mid-run; the file stays readable up to its last
    complete transaction.

    Usage: ``Journal("run.db")`` on a file of another run raises it on ``bind``.
    """


class RolloutWarning(UserWarning):
    """Warned when a rollout keeps none of the groups it was asked for (every one
    dropped by a filter, failed or left partial): the message is ``result.summary()``,
    with the filters' reasons counted, and says what to look at.

    Usage: ``warnings.simplefilter("error", RolloutWarning)`` makes such a run raise.
    """
