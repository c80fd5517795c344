"""The text stand-in engine in child processes, for benchmarks that push thousands of requests.

Usage (sync or async, as :class:`~miles_lite.testing.EngineProcess`)::

    with TextEngineProcess(TextStandInConfig(token_latency_s=0.001)) as engine:
        ...  # POST f"{engine.url}/generate"
    async with TextEngineProcessGroup([TextStandInConfig()] * 4) as group:
        group.urls

The child loads the Qwen3 tokenizer itself (about a second); ``stats()`` returns its
:class:`~miles_lite.testing.TextEngineStatistics` as JSON. Start-up, shutdown, timeouts
and errors are those of :class:`~miles_lite.testing.process.ChildProcess`. The text
stand-in has no fault switches, so there is no ``set_faults``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miles_lite.testing.process import ChildProcess, ProcessGroup
from miles_lite.testing.text.config import TextStandInConfig
from miles_lite.testing.text.engine import TextStandInEngine

__all__ = ["TextEngineProcess", "TextEngineProcessGroup"]


class TextEngineProcess(ChildProcess[TextStandInConfig]):
    """A :class:`~miles_lite.testing.TextStandInEngine` in a child process (see the module
    docstring). ``config`` defaults to ``TextStandInConfig()``; keyword arguments are
    :class:`~miles_lite.testing.process.ChildProcess`'s."""

    def __init__(self, config: TextStandInConfig | None = None, **kwargs: Any) -> None:
        config = config if config is not None else TextStandInConfig()
        super().__init__(TextStandInEngine, config, **kwargs)

    def stats(self) -> dict[str, Any]:
        """The child's :class:`~miles_lite.testing.TextEngineStatistics` as JSON
        (blocking HTTP)."""
        return self.call_json("/_stand_in/stats")


class TextEngineProcessGroup(ProcessGroup[TextEngineProcess]):
    """Several :class:`TextEngineProcess` started side by side (their start-ups overlap)."""

    def __init__(self, configs: Sequence[TextStandInConfig], **kwargs: Any) -> None:
        if not configs:
            raise ValueError(
                "TextEngineProcessGroup configs must hold at least one TextStandInConfig,"
                f" got {configs!r}"
            )
        super().__init__([TextEngineProcess(config, **kwargs) for config in configs])
