"""Agents for the agentic tests: plain OpenAI chat clients, as a user would write them.

``abort`` records its calls in ``ABORT_CALLS`` (an agent module's hook is module-level by
miles' contract); tests clear it first.
"""

from __future__ import annotations

from typing import Any

from .agents_plain import chat_client
from .conftest import TOOLS

ABORT_CALLS: list[Any] = []


async def run_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """Chat until the model stops calling the ``add`` tool; reward 1.0 for a boxed 5."""
    async with chat_client(base_url) as oa:
        messages = list(prompt)
        for _ in range(4):
            answer = await oa.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                **request_kwargs,
            )
            choice = answer.choices[0]
            messages.append(choice.message.model_dump(exclude_none=True))
            if choice.finish_reason != "tool_calls":
                text = choice.message.content or ""
                return {"reward": float("boxed{5}" in text), "metadata": {"turns": len(messages)}}
            messages.extend(
                {"role": "tool", "tool_call_id": call.id, "content": "5"}
                for call in choice.message.tool_calls or []
            )
    return 0.0


async def abort(ctx: Any) -> None:
    ABORT_CALLS.append(ctx)
