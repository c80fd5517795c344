"""The text stand-in engine in child processes, for benchmarks that push thousands of requests.

Usage (sync or async, as :class:`~miles_lite.testing.EngineProcess`)::

    with TextEngineProcess(TextStandInConfig(token_latency_s=0.001)) as engine:
        ...  # POST f"{engine.url}/generate"
    async with TextEngineProcessGroup([TextStandInConfig()] * 4) as group:
        group.urls

The child loads the Qwen3 tokenizer itself (about a second); ``stats()`` returns its
:class:`~miles_lite.testing.TextEngineStatistics` as JSON. Start-up, shutdown, timeouts
and errors are those of :class:`~miles_lite.testing.EngineProcess` (the shared base).
"""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import anyio

from miles_lite.testing.errors import StandInError
from miles_lite.testing.process import EngineProcess, EngineProcessGroup, serve_in_child
from miles_lite.testing.text.config import TextStandInConfig
from miles_lite.testing.text.engine import TextStandInEngine

__all__ = ["TextEngineProcess", "TextEngineProcessGroup"]


class TextEngineProcess(EngineProcess):
    """A :class:`~miles_lite.testing.TextStandInEngine` in a child process (see the module
    docstring). ``set_faults`` does not apply: the text stand-in has no fault switches."""

    config: TextStandInConfig  # type: ignore[assignment]

    def __init__(self, config: TextStandInConfig | None = None, **kwargs: Any) -> None:
        super().__init__(None, **kwargs)
        self.config = config if config is not None else TextStandInConfig()

    def _child_target(self) -> Any:
        return _text_child_main

    def set_faults(self, **switches: Any) -> dict[str, Any]:
        raise StandInError("the text stand-in engine has no fault switches")


class TextEngineProcessGroup(EngineProcessGroup):
    """Several :class:`TextEngineProcess` started side by side (their start-ups overlap)."""

    def __init__(self, configs: Sequence[TextStandInConfig], **kwargs: Any) -> None:
        if not configs:
            raise ValueError(
                "TextEngineProcessGroup configs must hold at least one TextStandInConfig,"
                f" got {configs!r}"
            )
        self.processes = [TextEngineProcess(config, **kwargs) for config in configs]


def _text_child_main(config: TextStandInConfig, conn: Connection) -> None:
    """Entry point of the child: serve until SIGTERM/SIGINT or until the parent goes away."""
    anyio.run(serve_in_child, TextStandInEngine, config, conn)
