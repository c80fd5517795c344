"""The agentic generate function: a user's agent speaks OpenAI chat through a session.

``AgentGenerate(run_agent)`` is a generate function: when the rollout opens with it, it
starts its own :class:`~miles_lite.agentic.server.SessionServer` (or uses the one given);
for each sample it opens a session in the run, calls ``await run_agent(base_url, prompt,
request_kwargs)`` with the session's base URL, the prompt as a ``messages`` list (no
client-side template) and the rollout's sampling settings in OpenAI names, always closes
the session, and builds samples from the recorded turns (TITO,
:mod:`miles_lite.agentic.assembly`).

The agent may return ``None``, a reward (a number or dict), or a dict with ``"reward"``
and/or ``"metadata"`` for its samples; without a reward the rollout's reward pool scores
them. An agent that raises fails its sample (:class:`~miles_lite.errors.AgentError`, the
traceback kept), as one returning anything else does.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
import traceback
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite._core.validate import check_choice, check_int, check_seconds
from miles_lite.agentic.assembly import AssemblyMode, assemble_samples
from miles_lite.agentic.config import SessionServerConfig
from miles_lite.agentic.server import SessionServer
from miles_lite.errors import AgentError, ConfigError, RewardError
from miles_lite.rewards.values import checked_scores
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.contract import AbortResult, GenerateFnInput
from miles_lite.sglang.sampling import chat_request_kwargs
from miles_lite.text.context import TextContext
from miles_lite.types import Sample, SampleStatus, SessionInfo

__all__ = ["AbortContext", "AgentGenerate", "RunAgent"]

_log = logging.getLogger(__name__)

#: ``async def run_agent(base_url, prompt, request_kwargs)`` (or a sync function).
RunAgent = Callable[[str, list[dict[str, Any]], dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class AbortContext:
    """What an agent's ``abort`` hook gets on early stop: the rollout id and the ids of
    the run's sessions (open ones, and those closed since the stop began: their agents
    returned when their requests were aborted), by which agents find their work."""

    rollout_id: int
    session_ids: tuple[str, ...]


class AgentGenerate:
    """A generate function running a custom agent per sample (see the module docstring).

    ``run_agent``: ``(base_url, prompt, request_kwargs)``, async or sync (a sync agent
    runs in a worker thread; on cancellation it is waited for, not abandoned: it ends once
    its requests fail, which they do as soon as its session is aborted or closed).
    ``sessions``: the session server's config (one is started when the rollout opens; by
    default :class:`SessionServerConfig`'s, which serves the agents from worker processes:
    ``SessionServerConfig(processes=0)`` serves them in the rollout's process), or a
    running :class:`SessionServer` to use. ``abort_hook``: the agent's ``abort(ctx)``,
    by default the ``abort`` attribute of ``run_agent``'s module, called once on early
    stop with an :class:`AbortContext`, bounded by ``abort_timeout_s``. ``mode``:
    ``"merged"`` (one sample per trajectory, miles' default) or ``"per_turn"``;
    ``max_seq_len`` (default: the rollout's ``max_context_len``) truncates by whole turns.
    Trailing stop tokens a template re-renders are bounded by the session server's
    ``max_trim_tokens`` (:class:`SessionServerConfig`). ``timeout_s``: the agent's time
    budget per sample (one hour by default); past it, its session is aborted (its turn in
    flight aborted at the engine, later requests answered ``abort`` at once), the agent
    cancelled (a sync agent's thread is waited for: it returns once its requests fail),
    and the sample fails with :class:`~miles_lite.errors.AgentError`. A reward the agent
    returns is checked as the reward pools check theirs (finite numbers, or dicts of
    them): anything else fails the sample with :class:`~miles_lite.errors.RewardError`.

    Raises ``ConfigError`` on a bad option, or when called before it is bound to a
    rollout's context (open the rollout with it: ``TextRollout.open(...,
    generate=AgentGenerate(run_agent))``).
    """

    def __init__(
        self,
        run_agent: RunAgent,
        *,
        sessions: SessionServerConfig | SessionServer | None = None,
        abort_hook: Callable[[AbortContext], Any] | None = None,
        mode: AssemblyMode = "merged",
        max_seq_len: int | None = None,
        abort_timeout_s: float = 10.0,
        timeout_s: float = 3600.0,
    ) -> None:
        if not callable(run_agent):
            raise ConfigError(f"AgentGenerate.run_agent must be callable, got {run_agent!r}")
        check_choice("AgentGenerate", "mode", mode, ("merged", "per_turn"))
        check_int("AgentGenerate", "max_seq_len", max_seq_len, optional=True)
        check_seconds("AgentGenerate", "abort_timeout_s", abort_timeout_s)
        check_seconds("AgentGenerate", "timeout_s", timeout_s)
        if sessions is not None and not isinstance(sessions, SessionServerConfig | SessionServer):
            raise ConfigError(
                f"AgentGenerate.sessions must be a SessionServerConfig or a SessionServer,"
                f" got {sessions!r}"
            )
        self._run_agent = run_agent
        self._sessions = sessions
        self._server = sessions if isinstance(sessions, SessionServer) else None
        self._context: TextContext | None = None
        self._abort_hook = abort_hook if abort_hook is not None else _module_abort(run_agent)
        self._mode: AssemblyMode = mode
        self._max_seq_len = max_seq_len
        self._abort_timeout_s = abort_timeout_s
        self._timeout_s = timeout_s
        # Each run's sessions still open, or closed since its stop began: for its abort hook.
        self._runs: weakref.WeakKeyDictionary[RunContext, dict[str, None]] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def session_config(self) -> SessionServerConfig:
        """The config of the session server the agents talk to: the one given, the given
        server's, or the default."""
        if isinstance(self._sessions, SessionServer):
            return self._sessions.config
        return self._sessions or SessionServerConfig()

    @property
    def server(self) -> SessionServer:
        """The session server the agents talk to; ``ConfigError`` before :meth:`bind`."""
        if self._server is None:
            raise ConfigError(
                "AgentGenerate has no session server yet: open the rollout with it"
                " (TextRollout.open(..., generate=AgentGenerate(run_agent))), or give it a"
                " running SessionServer (sessions=...)"
            )
        return self._server

    @asynccontextmanager
    async def bind(self, context: TextContext) -> AsyncIterator[None]:
        """Start the session server over ``context``'s router and sampling (unless one
        was given); stopped on exit."""
        self._context = context
        if isinstance(self._sessions, SessionServer):
            yield
            return
        async with SessionServer(context, self.session_config) as server:
            self._server = server
            try:
                yield
            finally:
                self._server = None

    async def __call__(self, input: GenerateFnInput[TextContext]) -> list[Sample]:
        """Run the agent for ``input.sample``; returns the samples of its session.

        Cancellation closes the session (shielded) and propagates.
        """
        server = self.server
        run, sample, ctx = input.run, input.sample, input.context
        if run.stopping:
            sample.status = SampleStatus.ABORTED
            sample.status_reason = "early_stop"
            return [sample]
        span = input.span
        span.generate_start = time.monotonic()
        session = await server.open_session(run)
        opened = self._runs.setdefault(run, {})
        opened[session.id] = None
        returned: Any = None
        failure: Exception | None = None
        timed_out = False
        try:
            async with anyio.create_task_group() as tg:
                agent_scope = anyio.CancelScope()

                async def budget() -> None:
                    nonlocal timed_out
                    await anyio.sleep(self._timeout_s)
                    timed_out = True
                    # Its turn in flight is aborted at the engine and every later request
                    # answered abort at once, so a sync agent's thread returns too.
                    await server.abort([session.id])
                    agent_scope.cancel()

                tg.start_soon(budget)
                with agent_scope:
                    try:
                        returned = await _call(
                            self._run_agent,
                            session.base_url,
                            _messages(sample.prompt),
                            chat_request_kwargs(input.sampling_params),
                        )
                    except Exception as exc:  # failure of the agent's own: its sample fails
                        failure = exc
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                records = await server.close_session(session.id)
            span.generate_end = time.monotonic()
            if not run.stopping:
                # Done before any stop: no abort hook needs it. Closed after the stop
                # began, its agent may have returned because its request was aborted.
                opened.pop(session.id, None)
        if timed_out:
            sample.fail(
                AgentError(
                    f"agent {_name(self._run_agent)} ran past its time budget"
                    f" (AgentGenerate timeout_s={self._timeout_s:g}): its session was closed"
                    f" and its turn in flight aborted at the engine ({len(records)} turn(s)"
                    " recorded, dropped)",
                    request_id=session.id,
                )
            )
            return [sample]
        if failure is not None:
            # Formatting reads the source files of every frame: off the loop.
            trace = await anyio.to_thread.run_sync(_format_traceback, failure)
            error = AgentError(
                f"agent {_name(self._run_agent)} raised {type(failure).__name__}: {failure}",
                agent_traceback=trace,
            ).with_context(request_id=session.id)
            error.__cause__ = failure
            sample.fail(error)
            return [sample]
        span.requests = len(records)
        reward, metadata = _agent_result(returned, self._run_agent, session.id)
        if reward is not None:
            try:
                # One rule for every way a reward arrives: the reward pools' own check.
                (reward,) = checked_scores(f"agent {_name(self._run_agent)}", [reward], [sample])
            except RewardError as exc:
                sample.fail(exc.with_context(request_id=session.id))
                return [sample]
        max_seq_len = self._max_seq_len or ctx.max_context_len
        tokenizer = ctx.tokenizer
        assembly = await anyio.to_thread.run_sync(
            lambda: assemble_samples(
                records,
                sample,
                mode=self._mode,
                max_seq_len=max_seq_len,
                max_trim_tokens=server.config.max_trim_tokens,
                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            )
        )
        info = SessionInfo(session.id, turns=len(records), tito_mismatches=assembly.mismatches)
        if not assembly.samples:
            sample.status = SampleStatus.ABORTED
            sample.status_reason = assembly.empty_reason
            sample.session = info
            return [sample]
        for out in assembly.samples:
            out.metadata.update(metadata)
            out.session = info
            if reward is not None:
                out.reward = reward
        return assembly.samples

    async def abort(self, run: RunContext) -> AbortResult:
        """Early stop of ``run``: its sessions answer every later request at once with
        ``finish_reason`` ``abort`` (the rollout already aborted their engine requests),
        then the agent's ``abort`` hook is called once with an :class:`AbortContext`,
        bounded by ``abort_timeout_s``. A missing hook is fine; a hook that raises or runs
        past the bound is reported in the result (``error``), never raised."""
        ids = tuple(self._runs.pop(run, {}))
        if self._server is not None:
            await self._server.abort(ids)
        hook = self._abort_hook
        if hook is None:
            return AbortResult(called=False)
        started = time.monotonic()
        error: Exception | None = None
        with anyio.move_on_after(self._abort_timeout_s) as scope:
            try:
                await _call(hook, AbortContext(rollout_id=run.rollout_id, session_ids=ids))
            except Exception as exc:  # reported, not fatal: the rollout's work is done
                error = exc
        if scope.cancelled_caught:
            error = TimeoutError(f"agent abort hook ran past {self._abort_timeout_s} s")
        if error is not None:
            _log.warning("agent abort hook failed: %r", error)
        return AbortResult(called=True, error=error, elapsed_s=time.monotonic() - started)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Await an async callable; run a sync one in a worker thread (it may block on I/O,
    e.g. a synchronous OpenAI client). The thread is waited for on cancellation: nothing
    outlives the rollout."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    ):
        return await fn(*args)
    result = await anyio.to_thread.run_sync(lambda: fn(*args))
    if inspect.isawaitable(result):
        return await result
    return result


def _format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _module_abort(fn: Any) -> Callable[[AbortContext], Any] | None:
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    hook = getattr(module, "abort", None) if module is not None else None
    return hook if callable(hook) else None


def _messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _agent_result(returned: Any, agent: Any, session_id: str) -> tuple[Any, dict[str, Any]]:
    """(reward or None, metadata) from what the agent returned; ``AgentError`` for
    anything else than None, a number, a dict of scores or ``{"reward", "metadata"}``."""
    if returned is None:
        return None, {}
    if isinstance(returned, bool | int | float):
        return float(returned), {}
    if isinstance(returned, dict) and ("reward" in returned or "metadata" in returned):
        metadata = returned.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise AgentError(
                f"agent {_name(agent)} returned metadata {metadata!r:.100}; want a dict",
                request_id=session_id,
            )
        return returned.get("reward"), dict(metadata)
    if isinstance(returned, dict):
        return returned, {}  # a dict reward (several keys)
    raise AgentError(
        f"agent {_name(agent)} returned {returned!r:.100}; return None, a reward (a number"
        " or a dict of them), or {'reward': ..., 'metadata': {...}}",
        request_id=session_id,
    )
