"""``multi_turn``: tool calling over ``/generate``, token in and token out.

Each turn sends everything so far (prompt, model outputs, tool results) as token ids;
the model's output ids and log-probs are appended as the engine returned them (loss mask
1); tool results go through the chat template and are appended with loss mask 0 and
log-prob 0.0. The sample ends COMPLETED when the model calls no tool, TRUNCATED at the
context limit, a turn's token budget or ``max_turns``, ABORTED on early stop, FAILED
(:class:`~miles_lite.errors.ToolError`) when a tool raises or runs past its timeout.
Malformed tool-call JSON is answered with a tool message saying so (the model may fix it).

Options (``input.options``; on the CLI, the flags :func:`add_arguments` registers):
``generate_max_turns`` (16), ``generate_tool_specs_path`` (OpenAI tool specs: a list,
or a dotted path to one or to a function returning one), ``generate_tool_call_parser``
(``qwen``/``hermes``, or a parser callable), ``generate_execute_tool_function_path``
(``async def execute_tool(name, arguments) -> str``, or its dotted path),
``generate_tool_timeout_s`` (30). An ABORTED sample starts again from its prompt.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from miles_lite.errors import ConfigError, GenerateError, ToolError
from miles_lite.rollout.contract import GenerateFnInput, load_function, load_object
from miles_lite.text.context import TextState
from miles_lite.text.request import (
    append_env_tokens,
    apply_generate_answer,
    build_generate_payload,
    check_text_sample,
    post_generate,
    status_of,
)
from miles_lite.text.single_turn import max_new_tokens_of, no_room_reason
from miles_lite.text.tool_calls import TOOL_CALL_PARSERS, ToolCall, ToolCallParser
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus

__all__ = ["MultiTurnOptions", "add_arguments", "generate"]

ExecuteTool = Callable[[str, dict[str, Any]], Awaitable[str]]
_EOS_TEXT = "<|im_end|>"


@dataclass(frozen=True, kw_only=True)
class MultiTurnOptions:
    """The settings of :func:`generate`, read from ``input.options`` (see the module doc)."""

    max_turns: int = 16
    tool_specs: list[dict[str, Any]] | None = None
    parser: ToolCallParser = TOOL_CALL_PARSERS["qwen"]
    execute_tool: ExecuteTool | None = None
    tool_timeout_s: float = 30.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MultiTurnOptions:
        """Resolve names and dotted paths; raises ConfigError naming a bad option."""
        max_turns = options.get("generate_max_turns", 16)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ConfigError(f"generate_max_turns must be an int >= 1, got {max_turns!r}")
        specs: Any = options.get("generate_tool_specs_path")
        if isinstance(specs, str):
            specs = load_object(specs)
        if callable(specs):
            specs = specs()
        if specs is not None and not (
            isinstance(specs, list) and all(isinstance(s, dict) for s in specs)
        ):
            raise ConfigError(
                f"generate_tool_specs_path must give a list of tool specs, got {specs!r:.200}"
            )
        parser: Any = options.get("generate_tool_call_parser", "qwen")
        if isinstance(parser, str):
            if parser not in TOOL_CALL_PARSERS:
                raise ConfigError(
                    f"generate_tool_call_parser {parser!r} is unknown; have {sorted(TOOL_CALL_PARSERS)}"
                    " (or pass a callable)"
                )
            parser = TOOL_CALL_PARSERS[parser]
        execute: Any = options.get("generate_execute_tool_function_path")
        if isinstance(execute, str):
            execute = load_function(execute)
        timeout = options.get("generate_tool_timeout_s", 30.0)
        if not isinstance(timeout, int | float) or not timeout > 0:
            raise ConfigError(f"generate_tool_timeout_s must be > 0, got {timeout!r}")
        return cls(
            max_turns=max_turns,
            tool_specs=specs,
            parser=parser,
            execute_tool=execute,
            tool_timeout_s=float(timeout),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register miles' multi-turn flags (their values reach :func:`generate` as options)."""
    group = parser.add_argument_group("multi-turn tool calling")
    group.add_argument("--generate-max-turns", type=int, default=16)
    group.add_argument("--generate-tool-specs-path", default=None, help="module.TOOLS")
    group.add_argument("--generate-tool-call-parser", default="qwen")
    group.add_argument("--generate-execute-tool-function-path", default=None, help="module.fn")
    group.add_argument("--generate-tool-timeout-s", type=float, default=30.0)


async def generate(input: GenerateFnInput) -> Sample:
    """Run one multi-turn tool-calling sample (see the module docstring)."""
    state: TextState = input.state
    sample = input.sample
    if sample.status not in (SampleStatus.PENDING, SampleStatus.ABORTED):
        return sample
    options = MultiTurnOptions.from_options(input.options)
    tools = options.tool_specs
    messages: list[dict[str, Any]] = (
        [dict(m) for m in sample.prompt]
        if isinstance(sample.prompt, list)
        else [{"role": "user", "content": sample.prompt}]
    )
    _reset(sample)
    sample.tokens = await _encode(state, await _render(state, messages, tools, True))
    params: dict[str, Any] = dict(input.sampling_params)
    max_new = max_new_tokens_of(params)
    span = input.span
    span.generate_start = time.monotonic()
    for _turn in range(options.max_turns):
        if state.stopping:
            sample.status = SampleStatus.ABORTED
            break
        budget = max_new
        if state.max_context_len is not None:
            budget = min(budget, state.max_context_len - len(sample.tokens))
        if budget <= 0:
            sample.status = SampleStatus.TRUNCATED
            sample.metadata["truncated_reason"] = no_room_reason(state, sample)
            break
        payload = build_generate_payload(
            sample, sample.tokens, {**params, "max_new_tokens": budget}
        )
        answer = await post_generate(state, payload, span)
        output_ids = apply_generate_answer(sample, answer)
        if status_of(answer) is not SampleStatus.COMPLETED:
            break
        text = str(answer.get("text", ""))
        calls = options.parser(text)
        if not calls:
            break
        messages.append({"role": "assistant", "content": _strip_eos(text)})
        started = time.monotonic()
        results = [{"role": "tool", "content": await _run_tool(c, options)} for c in calls]
        tool_time = time.monotonic() - started
        span.non_generation_time_s += tool_time
        sample.non_generation_time += tool_time
        messages.extend(results)
        ends_with_eos = bool(output_ids) and output_ids[-1] == _eos_id(state)
        env_text = await _env_text(state, results, ends_with_eos)
        append_env_tokens(sample, await _encode(state, env_text), env_text)
        sample.metadata["turns"] = sample.metadata.get("turns", 0) + 1
    else:
        sample.status = SampleStatus.TRUNCATED
        sample.metadata["truncated_reason"] = "max_turns"
    span.generate_end = time.monotonic()
    check_text_sample(sample)
    return sample


generate.add_arguments = add_arguments  # type: ignore[attr-defined]


async def _run_tool(call: Any, options: MultiTurnOptions) -> str:
    if not isinstance(call, ToolCall):
        return f"Error: {call.reason}. Write the call as JSON inside <tool_call></tool_call>."
    execute = options.execute_tool
    if execute is None:
        raise ToolError(
            f"the model called tool {call.name!r} but no execute_tool function is set"
            " (generate_execute_tool_function_path)"
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
    sample.non_generation_time = 0.0
    sample.prefix_cache_info = PrefixCacheInfo()
    sample.status = SampleStatus.PENDING


async def _render(
    state: TextState, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool
) -> str:
    text = await state.off_loop(
        lambda: state.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
        )
    )
    return str(text)


async def _encode(state: TextState, text: str) -> list[int]:
    ids = await state.off_loop(lambda: state.tokenizer.encode(text, add_special_tokens=False))
    return [int(i) for i in ids]


async def _env_text(
    state: TextState, tool_messages: list[dict[str, Any]], ends_with_eos: bool
) -> str:
    """The text the chat template puts after the model's output for ``tool_messages``.

    Rendered after a stand-in exchange rather than the real history, so a template that
    rewrites earlier turns (Qwen3 drops earlier ``<think>`` blocks) cannot shift it; the
    model's own tokens are never re-tokenized. When the model stopped at its
    end-of-turn token, that token is its own; otherwise the template's is glue.
    """
    anchor = "\u2063"  # an invisible separator no template adds by itself
    stand_in = [{"role": "user", "content": "."}, {"role": "assistant", "content": anchor}]
    full = await _render(state, [*stand_in, *tool_messages], None, True)
    at = full.rfind(anchor)
    if at < 0:
        raise GenerateError(
            "the chat template dropped the assistant message; cannot place tool turns"
        )
    env = full[at + len(anchor) :]
    if ends_with_eos and env.startswith(_EOS_TEXT):
        env = env[len(_EOS_TEXT) :]
    return env


def _strip_eos(text: str) -> str:
    return text[: -len(_EOS_TEXT)] if text.endswith(_EOS_TEXT) else text


def _eos_id(state: TextState) -> int:
    eos = state.tokenizer.convert_tokens_to_ids(_EOS_TEXT)
    return int(eos) if isinstance(eos, int) else -1
