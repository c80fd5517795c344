"""What the text stand-in has seen and done: live counters and their frozen snapshot.

:class:`TextEngineStats` is live (the engine updates it as it runs; tests read it at any
time); :class:`TextEngineStatistics` is a frozen snapshot of it with the engine's state
beside (:meth:`~miles_lite.testing.TextStandInEngine.statistics`, and ``GET
/_stand_in/stats`` as JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TextEngineStatistics", "TextEngineStats"]


@dataclass
class TextEngineStats:
    """Counters of one :class:`~miles_lite.testing.TextStandInEngine`, updated as it runs.

    ``requests``: the JSON bodies of ``/generate`` received (oldest first, bounded);
    ``request_versions``: the weight version ``/model_info`` reported when each arrived;
    ``rids_seen``: the rids generated for (both logs keep the first
    ``request_log_limit``); ``aborts``: ``/abort_request`` bodies;
    ``running`` / ``waiting``: generating now / waiting for a slot; ``max_running_seen``:
    the most generating at once; ``generated_tokens``: output tokens made in all;
    ``pauses``: ``/pause_generation`` calls; ``weight_loads``: weights loaded by
    ``/update_weights_from_disk``; ``flushes`` / ``flush_refusals``: cache flushes done /
    refused (400: requests were running).
    """

    requests: list[Any] = field(default_factory=list)
    request_versions: list[str] = field(default_factory=list)
    rids_seen: list[str] = field(default_factory=list)
    aborts: list[Any] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    max_running_seen: int = 0
    generated_tokens: int = 0
    chat_requests: int = 0
    pauses: int = 0
    weight_loads: int = 0
    flushes: int = 0
    flush_refusals: int = 0

    def log_request(self, body: Any, limit: int, version: str = "") -> None:
        """Keep ``body`` (and the ``version`` reported as it arrived) in :attr:`requests`
        unless ``limit`` bodies are kept already."""
        if len(self.requests) < limit:
            self.requests.append(body)
            self.request_versions.append(version)

    def log_rid(self, rid: str, limit: int) -> None:
        """Keep ``rid`` in :attr:`rids_seen` unless ``limit`` rids are kept already."""
        if len(self.rids_seen) < limit:
            self.rids_seen.append(rid)

    def snapshot(
        self, *, template_cache_hits: int, weight_version: str, paused: bool
    ) -> TextEngineStatistics:
        """A frozen copy of the counters, with the engine's state given beside."""
        return TextEngineStatistics(
            requests=tuple(self.requests),
            request_versions=tuple(self.request_versions),
            rids_seen=tuple(self.rids_seen),
            aborts=tuple(self.aborts),
            running=self.running,
            waiting=self.waiting,
            max_running_seen=self.max_running_seen,
            generated_tokens=self.generated_tokens,
            chat_requests=self.chat_requests,
            pauses=self.pauses,
            weight_loads=self.weight_loads,
            flushes=self.flushes,
            flush_refusals=self.flush_refusals,
            template_cache_hits=template_cache_hits,
            weight_version=weight_version,
            paused=paused,
        )


@dataclass(frozen=True, kw_only=True)
class TextEngineStatistics:
    """A snapshot of :class:`TextEngineStats` (:meth:`TextStandInEngine.statistics`).

    ``requests`` are the bodies of ``/generate`` and ``/v1/chat/completions`` received,
    ``request_versions`` the weight version ``/model_info`` reported as each arrived;
    ``chat_requests`` counts the latter; ``template_cache_hits`` counts chat renders
    served from the cache; ``paused`` is whether ``/pause_generation`` holds generation.
    """

    requests: tuple[Any, ...]
    request_versions: tuple[str, ...]
    rids_seen: tuple[str, ...]
    aborts: tuple[Any, ...]
    running: int
    waiting: int
    max_running_seen: int
    generated_tokens: int
    chat_requests: int
    pauses: int
    weight_loads: int
    flushes: int
    flush_refusals: int
    template_cache_hits: int
    weight_version: str
    paused: bool
