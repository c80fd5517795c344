"""The agentic generate function: a user's agent speaks OpenAI chat through a session.

``AgentGenerate(run_agent)`` is a generate function: for each sample it opens a session on
``input.state.sessions`` (a :class:`~miles_lite.sessions.SessionServer` the rollout
started), calls ``await run_agent(base_url, prompt, request_kwargs)`` with the session's
base URL, the prompt as a ``messages`` list (no client-side template) and the rollout's
sampling settings in OpenAI names, always closes the session, and builds samples from the
recorded turns (TITO, :mod:`miles_lite.agentic.assembly`).

The agent may return ``None``, a reward (a number or dict), or a dict with ``"reward"``
and/or ``"metadata"`` for its samples; without a reward the rollout's reward pool scores
them. An agent that raises fails its sample (:class:`~miles_lite.errors.AgentError`, the
traceback kept).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import logging
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite.agentic.assembly import AssemblyMode, assemble_samples
from miles_lite.agentic.server import SessionServer
from miles_lite.errors import AgentError, ConfigError
from miles_lite.rollout.contract import GenerateFnInput, load_function
from miles_lite.types import Sample, SampleStatus

__all__ = ["AgentAbortResult", "AgentGenerate", "chat_request_kwargs"]

_log = logging.getLogger(__name__)

RunAgent = Callable[[str, list[dict[str, Any]], dict[str, Any]], Awaitable[Any]]

#: /generate sampling keys and their OpenAI chat names (the agent passes them on).
_OPENAI_NAMES = {
    "max_new_tokens": "max_tokens",
    "sampling_seed": "seed",
    "temperature": "temperature",
    "top_p": "top_p",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
#: SGLang's chat extras: the openai client takes them only through ``extra_body``.
_EXTRA_NAMES = {
    "min_new_tokens": "min_tokens",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop_token_ids": "stop_token_ids",
    "repetition_penalty": "repetition_penalty",
}


def chat_request_kwargs(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The rollout's ``/generate`` sampling params as keyword arguments of
    ``openai.AsyncOpenAI().chat.completions.create``: OpenAI names at the top
    (``max_new_tokens`` -> ``max_tokens``, ...), SGLang's extras (``top_k``, ``min_p``,
    ...) under ``extra_body``; keys chat does not take are left out."""
    kwargs = {_OPENAI_NAMES[k]: v for k, v in sampling_params.items() if k in _OPENAI_NAMES}
    extra = {_EXTRA_NAMES[k]: v for k, v in sampling_params.items() if k in _EXTRA_NAMES}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


@dataclass(frozen=True, slots=True)
class AgentAbortResult:
    """How the agent module's ``abort`` hook went: ``called`` (it exists and was called),
    ``error`` (what it raised, or a timeout), ``elapsed_s``."""

    called: bool
    error: Exception | None
    elapsed_s: float


class AgentGenerate:
    """A generate function running a custom agent per sample (see the module docstring).

    ``run_agent``: a callable ``(base_url, prompt, request_kwargs)`` (async, or sync: then it
    runs in a worker thread), or ``None`` to
    load it from ``input.options["custom_agent_function_path"]`` (the CLI flag
    ``--custom-agent-function-path``). ``abort_hook``: the agent's optional
    ``abort(ctx)``; by default the ``abort`` attribute of ``run_agent``'s module. ``mode``:
    ``"merged"`` (one sample per trajectory, miles' default) or ``"per_turn"``;
    ``max_seq_len`` (default: the state's ``max_context_len``) truncates by whole turns;
    ``max_trim_tokens`` bounds re-rendered trailing stop tokens; ``abort_timeout_s``
    bounds the hook.

    Raises ``ConfigError`` on a call without a session server on the state, or without an
    agent.
    """

    def __init__(
        self,
        run_agent: RunAgent | None = None,
        *,
        abort_hook: Callable[[Any], Any] | None = None,
        mode: AssemblyMode = "merged",
        max_seq_len: int | None = None,
        max_trim_tokens: int = 1,
        abort_timeout_s: float = 10.0,
    ) -> None:
        if mode not in ("merged", "per_turn"):
            raise ConfigError(f"mode must be 'merged' or 'per_turn', got {mode!r}")
        if not abort_timeout_s > 0:
            raise ConfigError(f"abort_timeout_s must be > 0, got {abort_timeout_s!r}")
        if run_agent is not None and not callable(run_agent):
            raise ConfigError(f"run_agent must be callable, got {run_agent!r}")
        self._run_agent = run_agent
        self._abort_hook = abort_hook if abort_hook is not None else _module_abort(run_agent)
        self._mode: AssemblyMode = mode
        self._max_seq_len = max_seq_len
        self._max_trim_tokens = max_trim_tokens
        self._abort_timeout_s = abort_timeout_s
        self._sessions: SessionServer | None = None
        # Sessions closed after the rollout began stopping: the rollout aborts engine
        # requests before it calls the hook, so their agents may already have returned;
        # the hook still needs their ids to find the agents' work.
        self._stopped_sessions: dict[str, None] = {}

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Register ``--custom-agent-function-path`` (``package.module.run_agent``)."""
        parser.add_argument(
            "--custom-agent-function-path",
            dest="custom_agent_function_path",
            default=None,
            help="dotted path of the agent: async def run_agent(base_url, prompt, request_kwargs)",
        )

    async def __call__(self, input: GenerateFnInput) -> list[Sample]:
        """Run the agent for ``input.sample``; returns the samples of its session.

        Cancellation closes the session (shielded) and propagates.
        """
        state = input.state
        server = getattr(state, "sessions", None)
        if not isinstance(server, SessionServer):
            raise ConfigError(
                "agentic generation needs a SessionServer on input.state.sessions; open the "
                "rollout with sessions=SessionServer(...)"
            )
        self._sessions = server
        run_agent = self._resolve(input.options)
        sample = input.sample
        if state.stopping:
            sample.status = SampleStatus.ABORTED
            return [sample]
        prompt = _messages(sample.prompt)
        session = await server.open_session()
        returned: Any = None
        try:
            returned = await _call(
                run_agent, session.base_url, prompt, chat_request_kwargs(input.sampling_params)
            )
        except Exception as exc:
            # Formatting reads the source files of every frame: off the loop.
            trace = await anyio.to_thread.run_sync(_format_traceback, exc)
            sample.fail(
                AgentError(
                    f"agent {_name(run_agent)} raised {type(exc).__name__}: {exc}\n{trace}",
                    agent_traceback=trace,
                ).with_context(request_id=session.id)
            )
            sample.error.__cause__ = exc  # type: ignore[union-attr]
            return [sample]
        finally:
            with anyio.CancelScope(shield=True):
                records = await server.close_session(session.id)
            if state.stopping:
                self._stopped_sessions[session.id] = None
        max_seq_len = self._max_seq_len or getattr(state, "max_context_len", None)
        tokenizer = state.tokenizer
        assembly = await anyio.to_thread.run_sync(
            lambda: assemble_samples(
                records,
                sample,
                mode=self._mode,
                max_seq_len=max_seq_len,
                max_trim_tokens=self._max_trim_tokens,
                decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            )
        )
        if not assembly.samples:
            sample.status = SampleStatus.ABORTED
            sample.metadata["empty_reason"] = assembly.empty_reason
            return [sample]
        reward, metadata = _agent_result(returned)
        made = assembly.samples
        # The first sample is the input one, filled in place: the driver keeps the input
        # objects of groups stopped early (partial rollout), so their output must be there.
        for name in (f.name for f in dataclasses.fields(Sample)):
            setattr(sample, name, getattr(made[0], name))
        made[0] = sample
        for out in made:
            out.metadata.update(metadata)
            out.metadata["session_id"] = session.id
            if reward is not None:
                out.reward = reward
        return made

    async def abort(self, ctx: Any) -> AgentAbortResult:
        """Early stop: abort the sessions of ``ctx.session_ids`` at the session server (their
        engine requests, and every later request answers ``abort``), then call the agent's
        ``abort(ctx)`` hook once, bounded by ``abort_timeout_s``. The hook's ``ctx`` also
        names the sessions that closed since the stop began (their agents returned when
        their requests were aborted).

        A missing hook is fine; a hook that raises or runs past the bound is returned in
        :class:`AgentAbortResult` (``error``), never raised.
        """
        start = anyio.current_time()
        ids = dict.fromkeys(getattr(ctx, "session_ids", ()) or ())
        if self._sessions is not None:
            await self._sessions.abort(list(ids))
        ids.update(self._stopped_sessions)
        self._stopped_sessions = {}
        if dataclasses.is_dataclass(ctx) and not isinstance(ctx, type):
            with contextlib.suppress(TypeError):
                ctx = dataclasses.replace(ctx, session_ids=tuple(ids))
        hook = self._abort_hook
        if hook is None:
            return AgentAbortResult(called=False, error=None, elapsed_s=0.0)
        error: Exception | None = None
        with anyio.move_on_after(self._abort_timeout_s) as scope:
            try:
                await _call(hook, ctx)
            except Exception as exc:  # reported, not fatal: the rollout's work is done
                error = exc
        if scope.cancelled_caught:
            error = TimeoutError(f"agent abort hook ran past {self._abort_timeout_s} s")
        if error is not None:
            _log.warning("agent abort hook failed: %r", error)
        return AgentAbortResult(called=True, error=error, elapsed_s=anyio.current_time() - start)

    def _resolve(self, options: Mapping[str, Any]) -> RunAgent:
        if self._run_agent is not None:
            return self._run_agent
        path = options.get("custom_agent_function_path")
        if not path:
            raise ConfigError(
                "no agent: pass AgentGenerate(run_agent) or --custom-agent-function-path"
            )
        fn = load_function(path)
        self._run_agent = fn
        if self._abort_hook is None:
            self._abort_hook = _module_abort(fn)
        return fn


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Await an async callable; run a sync one in a worker thread (it may block on I/O,
    e.g. a synchronous OpenAI client); a cancelled thread is abandoned."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    ):
        return await fn(*args)
    result = await anyio.to_thread.run_sync(lambda: fn(*args), abandon_on_cancel=True)
    if inspect.isawaitable(result):
        return await result
    return result


def _format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _module_abort(fn: Any) -> Callable[[Any], Any] | None:
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    hook = getattr(module, "abort", None) if module is not None else None
    return hook if callable(hook) else None


def _messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _agent_result(returned: Any) -> tuple[Any, dict[str, Any]]:
    """(reward or None, metadata) from what the agent returned."""
    if returned is None:
        return None, {}
    if isinstance(returned, bool):
        return float(returned), {}
    if isinstance(returned, int | float):
        return float(returned), {}
    if isinstance(returned, dict) and ("reward" in returned or "metadata" in returned):
        metadata = returned.get("metadata") or {}
        return returned.get("reward"), dict(metadata)
    if isinstance(returned, dict):
        return returned, {}  # a dict reward (several keys)
    return None, {"agent_result": returned}
