"""The session server's config for tests that are not about its worker processes.

The library's default (``SessionServerConfig.processes="auto"``) serves agents from worker
processes of the server's own, and each costs seconds to start (it imports the library and
unpickles the tokenizer). Tests of anything else serve them in the rollout's process, by
choice: ``sessions=IN_PROCESS``, or ``SessionServerConfig(processes=0, ...)`` with other
settings. Only the tests of the process mode start workers
(``tests/agentic/test_server_modes.py``, the CLI's agent demo).
"""

from __future__ import annotations

from miles_lite.agentic.config import SessionServerConfig

__all__ = ["IN_PROCESS"]

#: Agents served in the rollout's own process and event loop.
IN_PROCESS = SessionServerConfig(processes=0)
