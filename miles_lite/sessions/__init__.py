"""Agentic rollouts: OpenAI chat through session-scoped URLs, samples from the recorded turns."""

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
