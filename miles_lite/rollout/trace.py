"""A picture of a rollout: its spans as a Chrome/Perfetto trace and as a PNG timeline.

Built from :attr:`RolloutResult.spans <miles_lite.RolloutResult.spans>` and
:attr:`~miles_lite.RolloutResult.times`, one track per engine slot and per pool worker:

- ``engine <url>`` / ``slot k``: ``generate`` from the moment the unit's request got a
  slot on that engine to its answer (``(aborted)``, ``(failed)`` when it ended so); an
  engine's slots are lanes packed from these intervals, so one slot never holds two
  generations at once, and an engine with no work shows one empty slot (idle);
- ``waiting for an engine slot``: from a unit's start to its lease, when it waited;
- ``parser pool`` / ``worker i``: ``deserialize`` (and ``fetch + generate`` with
  ``fetch_in_parser``); ``event loop`` / ``inline``: decoding on the loop;
- ``reward <kind>`` / ``worker i`` (or ``api``): ``reward``, queueing included;
- ``agent sessions``: an agent's whole run, from its session's opening to its closing;
- ``rollout`` / ``run``: the run, and ``early stop`` (abort at the engines, drain) when
  the stop cut work short (:func:`stopped_early`); a stop that found nothing left to cut
  (the last groups ended as the target was reached) is ``stop (nothing cut)``.

A worker that needs more than one lane (``worker 0, queued +1``) had calls waiting
behind each other: the pool was saturated. Trace events are Chrome's "complete" events (``ph``
``X``, ``ts``/``dur`` in microseconds from the run's start, ``pid`` per group, ``tid``
per track, named by ``M`` metadata events), which https://ui.perfetto.dev and
chrome://tracing open.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.spans import UnitSpan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TraceEvent",
    "Track",
    "stopped_early",
    "timeline_figure",
    "timeline_tracks",
    "trace_json",
    "write_timeline_png",
    "write_trace",
]

#: A wait for a slot shorter than this (seconds) is not drawn.
_MIN_WAIT_S = 1e-3


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One interval on a track: ``name``, ``start``/``end`` (``time.monotonic()``
    seconds), ``args`` shown with it."""

    name: str
    start: float
    end: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Track:
    """A row of the timeline: ``group`` (an engine, a pool, the rollout) and ``name``
    (a slot, a worker), its events in time order, none overlapping another."""

    group: str
    name: str
    events: list[TraceEvent] = field(default_factory=list)


def _args(span: UnitSpan) -> dict[str, Any]:
    args: dict[str, Any] = {"group": span.group_index, "unit": span.unit_index, "size": span.size}
    if span.requests:
        args["requests"] = span.requests
    if span.wire_bytes:
        args["wire_bytes"] = span.wire_bytes
    if span.error:
        args["error"] = span.error
    return args


def _pack(
    group: str, name: str, events: Iterable[TraceEvent], *, keep: int = 0, slots: bool = False
) -> list[Track]:
    """``events`` in as few lanes as keep them apart (first lane that is free); at least
    ``keep`` lanes. Lane ``k`` is ``name k`` with ``slots`` (engine slots), else lane 0 is
    ``name`` and lane ``k`` ``name, queued +k`` (calls that waited for a busy worker)."""
    lanes: list[Track] = []
    for event in sorted(events, key=lambda e: (e.start, e.end)):
        for lane in lanes:
            if lane.events[-1].end <= event.start:
                lane.events.append(event)
                break
        else:
            lanes.append(Track(group, name, [event]))
    while len(lanes) < keep:
        lanes.append(Track(group, name))
    for k, lane in enumerate(lanes):
        if slots:
            lane.name = f"{name} {k}"
        elif k:
            lane.name = f"{name}, queued +{k}"
    return lanes


def timeline_tracks(result: RolloutResult) -> list[Track]:
    """The tracks of ``result`` (see the module docstring), in display order."""
    spans = result.spans
    engines = list(result.engines) + sorted(
        {s.engine for s in spans if s.engine is not None} - set(result.engines)
    )
    per_engine: dict[str, list[TraceEvent]] = {url: [] for url in engines}
    waits: list[TraceEvent] = []
    parser: dict[int, list[TraceEvent]] = {}
    inline: list[TraceEvent] = []
    rewards: dict[tuple[str, int | None], list[TraceEvent]] = {}
    agents: list[TraceEvent] = []
    for span in spans:
        args = _args(span)
        start, leased, end = span.generate_start, span.leased_at, span.generate_end
        if start is not None and leased is not None and leased - start > _MIN_WAIT_S:
            waits.append(TraceEvent("waiting for a slot", start, leased, args))
        began = leased if leased is not None else start
        if end is not None and began is not None:
            outcome = " (failed)" if span.error else " (aborted)" if span.aborted else ""
            event = TraceEvent("generate" + outcome, began, end, args)
            if span.engine is not None:
                per_engine[span.engine].append(event)
                if span.parser_worker is not None and span.fetched_in_parser:
                    # The worker itself waited for the engine's answer.
                    parser.setdefault(span.parser_worker, []).append(
                        TraceEvent("fetch + generate", began, end, args)
                    )
            else:
                agents.append(TraceEvent("agent" + outcome, began, end, args))
        if span.deserialize_start is not None and span.deserialize_end is not None:
            event = TraceEvent("deserialize", span.deserialize_start, span.deserialize_end, args)
            if span.parser_worker is not None:
                parser.setdefault(span.parser_worker, []).append(event)
            else:
                inline.append(event)
        if span.reward_start is not None and span.reward_end is not None:
            key = (span.reward_pool or "reward", span.reward_worker)
            rewards.setdefault(key, []).append(
                TraceEvent("reward", span.reward_start, span.reward_end, args)
            )
    tracks: list[Track] = []
    for url in engines:
        tracks += _pack(f"engine {url}", "slot", per_engine[url], keep=1, slots=True)
    tracks += _pack("waiting for an engine slot", "unit", waits, slots=True)
    tracks += _pack("agent sessions", "session", agents, slots=True)
    for index in sorted(parser):
        tracks += _pack("parser pool", f"worker {index}", parser[index])
    tracks += _pack("event loop", "inline", inline)
    for kind, worker in sorted(rewards, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        name = "api" if worker is None else f"worker {worker}"
        tracks += _pack(f"reward {kind}", name, rewards[(kind, worker)])
    times = result.times
    run = [TraceEvent("rollout", times.start, times.end, {"rollout_id": result.rollout_id})]
    stop = []
    if times.stop_start is not None and times.stop_end is not None:
        name = "early stop (abort, drain)" if stopped_early(result) else "stop (nothing cut)"
        stop = [TraceEvent(name, times.stop_start, times.stop_end)]
    tracks.append(Track("rollout", "run", run))
    if stop:
        tracks.append(Track("rollout", "early stop", stop))
    return tracks


def stopped_early(result: RolloutResult) -> bool:
    """Whether ``result``'s run stopped early and cut work short: a group left partial or
    a generation aborted. A run reaches its stop once enough groups are kept while others
    still count as running; when those had in fact ended, the stop cut nothing."""
    if result.times.stop_start is None:
        return False
    return bool(result.partial) or any(span.aborted for span in result.spans)


def trace_json(result: RolloutResult) -> dict[str, Any]:
    """``result`` as a Chrome trace (``{"traceEvents": [...]}``, see the module doc)."""
    origin = result.times.start
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    for tid, track in enumerate(timeline_tracks(result), start=1):
        if track.group not in pids:
            pids[track.group] = pid = len(pids) + 1
            events.append(_meta("process_name", pid, 0, track.group))
            events.append(_meta("process_sort_index", pid, 0, pid, key="sort_index"))
        pid = pids[track.group]
        events.append(_meta("thread_name", pid, tid, track.name))
        events.append(_meta("thread_sort_index", pid, tid, tid, key="sort_index"))
        events.extend(
            {
                "name": event.name,
                "cat": event.name.split(" ")[0],
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": round((event.start - origin) * 1e6, 1),
                "dur": round(max(0.0, event.end - event.start) * 1e6, 1),
                "args": event.args,
            }
            for event in track.events
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "rollout_id": result.rollout_id,
            "metrics": {k: v for k, v in sorted(result.metrics.items())},
        },
    }


def _meta(name: str, pid: int, tid: int, value: object, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def write_trace(result: RolloutResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result`` as a Chrome/Perfetto trace (JSON) to ``path``; return the path.

    Blocking file I/O: from async code, run it in a thread
    (``await anyio.to_thread.run_sync(write_trace, result, path)``).
    """
    path = Path(path)
    path.write_text(json.dumps(trace_json(result)))
    return path


#: Event colours of the PNG, by the first word of the event's name.
_COLOURS = {
    "generate": "#4C72B0",
    "fetch": "#64B5CD",
    "waiting": "#CCCCCC",
    "deserialize": "#DD8452",
    "reward": "#55A868",
    "agent": "#8172B3",
    "rollout": "#E5E5E5",
    "early": "#C44E52",
    "stop": "#999999",
}


def write_timeline_png(
    result: RolloutResult, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Draw ``result``'s tracks as a PNG timeline (:func:`timeline_figure`) at ``path``;
    return the path.

    Needs matplotlib (``pip install matplotlib``, in the ``demo``, ``dev`` and ``bench``
    extras): ``ModuleNotFoundError`` saying so when it is missing. Blocking (rendering,
    file I/O): from async code, run it in a thread.
    """
    fig = timeline_figure(result, title=title)
    path = Path(path)
    try:
        fig.savefig(path, dpi=110)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path


def timeline_figure(result: RolloutResult, *, title: str | None = None) -> Figure:
    """``result``'s tracks as a matplotlib figure (seconds from the run's start), one axes:
    aborted and failed generations hatched, a red line across every track where the run
    stopped early (only if the stop cut work short: :func:`stopped_early`), the legend
    beside the axes, never over a bar. The caller closes it (``plt.close(fig)``).

    Needs matplotlib: ``ModuleNotFoundError`` saying so when it is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "write_timeline_png needs matplotlib: pip install matplotlib"
        ) from exc
    tracks = timeline_tracks(result)
    origin = result.times.start
    height = min(60.0, 1.6 + 0.24 * len(tracks))
    # Constrained layout makes room for the legend outside the axes.
    fig, ax = plt.subplots(figsize=(12, height), layout="constrained")
    labels = []
    for row, track in enumerate(tracks):
        y = len(tracks) - 1 - row
        labels.append((y, f"{track.group}  {track.name}"))
        for event in track.events:
            kind = event.name.split(" ")[0]
            ax.broken_barh(
                [(event.start - origin, max(event.end - event.start, 1e-4))],
                (y - 0.4, 0.8),
                facecolors=_COLOURS.get(kind, "#999999"),
                hatch="//" if ("aborted" in event.name or "failed" in event.name) else None,
                edgecolor="white" if kind != "rollout" else "#BBBBBB",
                linewidth=0.3,
            )
    if result.times.stop_start is not None and stopped_early(result):
        ax.axvline(
            result.times.stop_start - origin,
            color=_COLOURS["early"],
            linewidth=1.2,
            label="early stop",
        )
    ax.set_yticks([y for y, _ in labels], [label for _, label in labels], fontsize=7)
    ax.set_ylim(-0.8, len(tracks) - 0.2)
    ax.set_xlabel("seconds since the rollout started")
    ax.grid(axis="x", linewidth=0.3)
    metrics = result.metrics
    kept = int(metrics.get("rollout/kept_groups", len(result.groups)))
    ax.set_title(
        title
        or f"rollout {result.rollout_id}: {kept} groups kept, {len(result.partial)} partial,"
        f" {metrics.get('perf/rollout_time', result.times.end - origin):.2f} s",
        fontsize=10,
    )
    shown = {e.name.split(" ")[0] for t in tracks for e in t.events}
    ax.legend(
        handles=[Patch(color=c, label=k) for k, c in _COLOURS.items() if k in shown],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        borderaxespad=0.0,
        fontsize=7,
    )
    return fig
