"""The diffusion stand-in engine in child processes: :class:`ChildProcess` specialised.

Usage (sync or async)::

    with EngineProcess(StandInConfig(step_latency_s=0.01)) as engine:
        ...  # POST f"{engine.url}/rollout/generate"
    async with EngineProcessGroup([StandInConfig()] * 4) as group:
        group.urls

Start-up, shutdown, timeouts and errors are those of
:class:`~miles_lite.testing.process.ChildProcess`; this adds the diffusion stand-in's
runtime controls over HTTP (:meth:`EngineProcess.set_faults`, :meth:`EngineProcess.stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miles_lite.testing.diffusion.config import StandInConfig
from miles_lite.testing.diffusion.engine import StandInEngine
from miles_lite.testing.process import ChildProcess, ProcessGroup

__all__ = ["EngineProcess", "EngineProcessGroup"]


class EngineProcess(ChildProcess[StandInConfig]):
    """A :class:`~miles_lite.testing.StandInEngine` in a child process.

    ``config`` defaults to ``StandInConfig()``; ``start_timeout_s``, ``stop_timeout_s`` and
    ``start_method`` are :class:`~miles_lite.testing.process.ChildProcess`'s (see there
    for start, stop and their errors).
    """

    def __init__(
        self,
        config: StandInConfig | None = None,
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 5.0,
        start_method: str = "spawn",
    ) -> None:
        super().__init__(
            StandInEngine,
            config if config is not None else StandInConfig(),
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
            start_method=start_method,
        )

    def set_faults(self, **switches: Any) -> dict[str, Any]:
        """Set :class:`~miles_lite.testing.Faults` switches in the child (blocking HTTP).

        Returns the switches now in force. Raises urllib.error.HTTPError (400) for an
        unknown switch or a bad value. From async code, POST ``/_stand_in/faults`` instead.
        """
        return self.call_json("/_stand_in/faults", switches)

    def stats(self) -> dict[str, Any]:
        """The child's :class:`~miles_lite.testing.EngineStats` as JSON (blocking HTTP)."""
        return self.call_json("/_stand_in/stats")


class EngineProcessGroup(ProcessGroup[EngineProcess]):
    """Several :class:`EngineProcess` started side by side (their start-ups overlap).

    Usage: ``with EngineProcessGroup([StandInConfig()] * 4) as group: group.urls``.
    If one fails to start, all are stopped and its error is raised. Sync and async
    context manager, like :class:`EngineProcess`; keyword arguments go to each.
    """

    def __init__(self, configs: Sequence[StandInConfig], **kwargs: Any) -> None:
        if not configs:
            raise ValueError(
                f"EngineProcessGroup configs must hold at least one StandInConfig, got {configs!r}"
            )
        super().__init__([EngineProcess(config, **kwargs) for config in configs])
