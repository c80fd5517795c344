"""A multi-turn tool-calling rollout over /generate, on an in-process stand-in engine.

python examples/text_tool_calling.py

The stand-in answers with the real Qwen3 tokenizer and a scripted policy: it calls the
``add`` tool, then answers with the tool's result. The sample's tokens, loss mask and
log-probs are printed side by side: the tool result and template glue have mask 0 and
log-prob 0.0; the model's tokens carry the engine's log-probs.
"""

from __future__ import annotations

from typing import Any

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.testing import (
    ADD_TOOLS,
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    load_qwen3_tokenizer,
)
from miles_lite.text import MultiTurn, MultiTurnOptions

POLICY = TextPolicy(
    rules=[
        TextRule(r"<tool_response>", "The sum is \\boxed{5}."),
        TextRule(
            r"add", '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        ),
    ]
)


async def execute_tool(name: str, arguments: dict[str, Any]) -> str:
    """The tool the model calls (a real one would run code, query a service, ...)."""
    return str(arguments["a"] + arguments["b"])


async def main() -> None:
    tokenizer = load_qwen3_tokenizer()
    async with TextStandInEngine(TextStandInConfig(policy=POLICY), tokenizer) as engine:
        config = TextRolloutConfig(
            n_samples_per_prompt=1, sampling=TextSamplingParams(max_new_tokens=64)
        )
        async with TextRollout.open(
            [engine.url],
            tokenizer=tokenizer,
            config=config,
            generate=MultiTurn(MultiTurnOptions(tool_specs=ADD_TOOLS, execute_tool=execute_tool)),
        ) as rollout:
            result = await rollout.run([[{"role": "user", "content": "Please add 2 and 3."}]])
    (sample,) = result.samples
    print(f"status {sample.status.value}, turns {sample.turns}")
    prompt_len = len(sample.tokens) - sample.response_length
    print(f"{'position':>8}  {'token id':>8}  {'mask':>4}  {'log-prob':>8}  text")
    log_probs: list[float] = sample.rollout_log_probs  # type: ignore[assignment]
    for i, token in enumerate(sample.tokens[prompt_len:]):
        text = tokenizer.decode([token]).replace("\n", "\\n")
        print(f"{i:>8}  {token:>8}  {sample.loss_mask[i]:>4}  {log_probs[i]:>8.3f}  {text}")  # type: ignore[index]


if __name__ == "__main__":
    run_sync(main)
