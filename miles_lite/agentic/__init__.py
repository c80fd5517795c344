"""Agentic rollouts: OpenAI chat through session-scoped URLs, samples from the recorded turns.

Usage::

    async with TextRollout.open(urls, tokenizer=tok, generate=AgentGenerate(run_agent)) as rollout:
        result = await rollout.run([[{"role": "user", "content": "Please add 2 and 3."}]])

where ``async def run_agent(base_url, prompt, request_kwargs)`` talks to ``base_url`` with
any OpenAI client (``openai.AsyncOpenAI(base_url=base_url, api_key="-")``) and may return a
reward. Each session's turns become one merged sample (or one per turn), with the token ids
and log-probs the engine returned.
"""

from miles_lite.agentic.agent import AbortContext, AgentGenerate, RunAgent
from miles_lite.agentic.assembly import (
    Assembly,
    AssemblyMode,
    assemble_samples,
    merge_turns,
    truncate_turns,
    turn_samples,
)
from miles_lite.agentic.config import Session, SessionServerConfig, SessionServerStatistics
from miles_lite.agentic.server import SessionServer
from miles_lite.agentic.template_check import AppendOnlyReport, TemplateBreak, check_append_only

__all__ = [
    "AbortContext",
    "AgentGenerate",
    "AppendOnlyReport",
    "Assembly",
    "AssemblyMode",
    "RunAgent",
    "Session",
    "SessionServer",
    "SessionServerConfig",
    "SessionServerStatistics",
    "TemplateBreak",
    "assemble_samples",
    "check_append_only",
    "merge_turns",
    "truncate_turns",
    "turn_samples",
]
