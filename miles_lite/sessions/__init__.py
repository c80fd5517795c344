"""Agentic rollouts: OpenAI chat through session-scoped URLs, samples from the recorded turns.

Usage::

    async with TextRollout.open(
        urls, tokenizer=tok, generate=AgentGenerate(run_agent), session_server=SessionServerConfig()
    ) as rollout:
        result = await rollout.run([[{"role": "user", "content": "Please add 2 and 3."}]])

where ``async def run_agent(base_url, prompt, request_kwargs)`` talks to ``base_url`` with
any OpenAI client (``openai.AsyncOpenAI(base_url=base_url, api_key="-")``) and may return a
reward. Each session's turns become one merged sample (or one per turn), with the token ids
and log-probs the engine returned.
"""

from miles_lite.sessions.assembly import (
    Assembly,
    AssemblyMode,
    assemble_samples,
    merge_turns,
    status_of,
    truncate_turns,
    turn_samples,
)
from miles_lite.sessions.records import TurnRecord, record_from_choice
from miles_lite.sessions.server import (
    Session,
    SessionServer,
    SessionServerConfig,
    SessionServerStatistics,
)
from miles_lite.sessions.template_check import (
    AppendOnlyReport,
    TemplateBreak,
    check_append_only,
)

__all__ = [
    "AppendOnlyReport",
    "Assembly",
    "AssemblyMode",
    "Session",
    "SessionServer",
    "SessionServerConfig",
    "SessionServerStatistics",
    "TemplateBreak",
    "TurnRecord",
    "assemble_samples",
    "check_append_only",
    "merge_turns",
    "record_from_choice",
    "status_of",
    "truncate_turns",
    "turn_samples",
]
