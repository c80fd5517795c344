"""``MultiTurn``: tool calling over ``/generate``, token in and token out.

Each turn sends everything so far (prompt, model outputs, tool results) as token ids;
the model's output ids and log-probs are appended as the engine returned them (loss mask
1); tool results go through the chat template and are appended with loss mask 0 and
log-prob 0.0. The sample ends COMPLETED when the model calls no tool, TRUNCATED at the
context limit, a turn's token budget or ``max_turns`` (``status_reason``), ABORTED on
early stop, FAILED (:class:`~miles_lite.errors.ToolError`) when a tool raises or runs past
its timeout. Malformed tool-call JSON is answered with a tool message saying so (the
model may fix it). An ABORTED sample starts again from its prompt.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite._core.validate import check_int, check_seconds
from miles_lite.errors import ConfigError, ToolError
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.sglang.generate_wire import build_generate_payload
from miles_lite.text.context import TextContext
from miles_lite.text.request import append_env_tokens, apply_answer, post_generate
from miles_lite.text.single_turn import max_new_tokens_of, no_room_reason
from miles_lite.text.tokenize import encode, render, text_after_turn
from miles_lite.text.tool_calls import TOOL_CALL_PARSERS, ToolCall, ToolCallError, ToolCallParser
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus

__all__ = ["ExecuteTool", "MultiTurn", "MultiTurnOptions"]

ExecuteTool = Callable[[str, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True, kw_only=True)
class MultiTurnOptions:
    """The settings of :class:`MultiTurn`.

    ``max_turns``: model turns at most; ``tool_specs``: OpenAI tool specs the chat
    template renders; ``parser``: reads the calls in a turn's text (Qwen/Hermes
    ``<tool_call>`` JSON by default); ``execute_tool``: ``async (name, arguments) -> str``;
    ``tool_timeout_s``: bound on one tool call; ``end_of_turn``: the text that ends a
    model turn in the template (``None``: the tokenizer's ``eos_token``).

    Usage: ``MultiTurnOptions(tool_specs=TOOLS, execute_tool=run_tool, max_turns=8)``.
    """

    max_turns: int = 16
    tool_specs: list[dict[str, Any]] | None = None
    parser: ToolCallParser = TOOL_CALL_PARSERS["qwen"]
    execute_tool: ExecuteTool | None = None
    tool_timeout_s: float = 30.0
    end_of_turn: str | None = None

    def __post_init__(self) -> None:
        owner = "MultiTurnOptions"
        check_int(owner, "max_turns", self.max_turns)
        check_seconds(owner, "tool_timeout_s", self.tool_timeout_s)
        specs = self.tool_specs
        if specs is not None and not (
            isinstance(specs, list) and all(isinstance(s, dict) for s in specs)
        ):
            raise ConfigError(
                f"{owner}.tool_specs must be a list of tool specs, got {specs!r:.200}"
            )
        if not callable(self.parser):
            raise ConfigError(f"{owner}.parser must be callable, got {self.parser!r}")
        if self.execute_tool is not None and not callable(self.execute_tool):
            raise ConfigError(f"{owner}.execute_tool must be callable, got {self.execute_tool!r}")


class MultiTurn:
    """A generate function running one multi-turn tool-calling sample (see the module
    docstring) under ``options``."""

    def __init__(self, options: MultiTurnOptions | None = None) -> None:
        self.options = options or MultiTurnOptions()

    async def __call__(self, input: GenerateFnInput[TextContext]) -> Sample:
        """Run one sample: turns until no tool is called, a limit, or the stop."""
        ctx, run, sample = input.context, input.run, input.sample
        if sample.status not in (SampleStatus.PENDING, SampleStatus.ABORTED):
            return sample
        options = self.options
        tools = options.tool_specs
        eot = options.end_of_turn or str(getattr(ctx.tokenizer, "eos_token", "") or "")
        messages: list[dict[str, Any]] = (
            [dict(m) for m in sample.prompt]
            if isinstance(sample.prompt, list)
            else [{"role": "user", "content": sample.prompt}]
        )
        _reset(sample)
        sample.tokens = await encode(ctx, await render(ctx, messages, tools))
        params = input.sampling_params
        max_new = max_new_tokens_of(params)
        span = input.span
        span.generate_start = time.monotonic()
        for _turn in range(options.max_turns):
            if run.stopping:
                sample.status = SampleStatus.ABORTED
                sample.status_reason = "early_stop"
                break
            budget = max_new
            if ctx.max_context_len is not None:
                budget = min(budget, ctx.max_context_len - len(sample.tokens))
            if budget <= 0:
                sample.status = SampleStatus.TRUNCATED
                sample.status_reason = no_room_reason(ctx, sample)
                break
            payload = build_generate_payload(
                sample.tokens, {**params, "max_new_tokens": budget}, seed=sample.seed
            )
            answer = await post_generate(ctx, run, payload, span)
            if answer is None:
                sample.status = SampleStatus.ABORTED
                sample.status_reason = "early_stop"
                break
            apply_answer(sample, answer)
            if answer.status is not SampleStatus.COMPLETED:
                break
            calls = options.parser(answer.text)
            if not calls:
                break
            messages.append({"role": "assistant", "content": _strip(answer.text, eot)})
            started = time.monotonic()
            results = [{"role": "tool", "content": await _run_tool(c, options)} for c in calls]
            tool_time = time.monotonic() - started
            span.non_generation_time_s += tool_time
            sample.non_generation_time += tool_time
            messages.extend(results)
            ended = bool(answer.ids) and answer.ids[-1] == _token_id(ctx, eot)
            env_text = await text_after_turn(ctx, results, end_of_turn=eot, turn_ended=ended)
            append_env_tokens(sample, await encode(ctx, env_text), env_text)
            sample.turns += 1
        else:
            sample.status = SampleStatus.TRUNCATED
            sample.status_reason = "max_turns"
        span.generate_end = time.monotonic()
        return sample


async def _run_tool(call: ToolCall | ToolCallError, options: MultiTurnOptions) -> str:
    if not isinstance(call, ToolCall):
        return f"Error: {call.reason}. Write the call as JSON inside <tool_call></tool_call>."
    execute = options.execute_tool
    if execute is None:
        raise ToolError(
            f"the model called tool {call.name!r} but MultiTurnOptions.execute_tool is not set"
        )
    try:
        with anyio.fail_after(options.tool_timeout_s):
            result = await execute(call.name, call.arguments)
    except TimeoutError as exc:
        raise ToolError(
            f"tool {call.name!r} ran past its timeout of {options.tool_timeout_s} s"
        ) from exc
    except Exception as exc:
        raise ToolError(f"tool {call.name!r} raised {type(exc).__name__}: {exc}") from exc
    return str(result)


def _reset(sample: Sample) -> None:
    sample.tokens = []
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = []
    sample.rollout_log_probs = []
    sample.weight_versions = []
    sample.weight_spans = []
    sample.turns = 0
    sample.non_generation_time = 0.0
    sample.prefix_cache_info = PrefixCacheInfo()
    sample.status = SampleStatus.PENDING
    sample.status_reason = None


def _strip(text: str, eot: str) -> str:
    return text[: -len(eot)] if eot and text.endswith(eot) else text


def _token_id(ctx: TextContext, text: str) -> int:
    token = ctx.tokenizer.convert_tokens_to_ids(text) if text else None
    return token if isinstance(token, int) else -1
