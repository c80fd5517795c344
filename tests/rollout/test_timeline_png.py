"""The PNG timeline's marks: the red early-stop line only where the stop cut work short,
and the legend beside the axes, over no bar."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import matplotlib.pyplot as plt
import pytest

from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.spans import RunTimes
from miles_lite.rollout.trace import stopped_early, timeline_figure, timeline_tracks
from tests.rollout.test_trace import early_stopped_rollout

RED = "#C44E52"


def marks(result: RolloutResult) -> tuple[list[float], bool]:
    """The red vertical lines the figure draws (their x), and whether the legend's box
    stays clear of the axes' box (both in display pixels, once drawn)."""
    fig = timeline_figure(result)
    try:
        fig.canvas.draw()
        (ax,) = fig.axes
        red = [float(line.get_xdata()[0]) for line in ax.lines if line.get_color() == RED]
        legend = ax.get_legend().get_window_extent()
        frame = ax.get_window_extent()
        figure = fig.bbox
        apart = legend.x0 >= frame.x1 and legend.x1 <= figure.x1 and legend.y0 >= figure.y0
        return red, apart
    finally:
        plt.close(fig)


@pytest.mark.anyio
async def test_an_early_stop_is_a_red_line_and_the_legend_is_beside_the_bars(
    tokenizer: Any,
) -> None:
    result = await early_stopped_rollout(tokenizer)
    times = result.times
    assert times.stop_start is not None and result.partial and stopped_early(result)
    red, apart = await anyio.to_thread.run_sync(marks, result)
    assert red == [pytest.approx(times.stop_start - times.start)]
    assert apart
    (stop,) = [t for t in timeline_tracks(result) if t.name == "early stop"]
    assert [e.name for e in stop.events] == ["early stop (abort, drain)"]


@pytest.mark.anyio
async def test_a_stop_that_cut_nothing_draws_no_red_line(tokenizer: Any) -> None:
    finished = await early_stopped_rollout(tokenizer)
    # The same run's spans with nothing partial and nothing aborted, and a stop that
    # found its last groups ended: the driver's stop when those groups' ends were still
    # on their way to its scheduler.
    spans = [dataclasses.replace(s, aborted=False) for s in finished.spans]
    times = finished.times
    assert times.stop_start is not None and times.stop_end is not None
    result = dataclasses.replace(
        finished,
        partial=[],
        spans=spans,
        times=RunTimes(times.start, times.end, times.stop_start, times.stop_end),
    )
    assert not stopped_early(result)
    red, apart = await anyio.to_thread.run_sync(marks, result)
    assert red == [] and apart
    (stop,) = [t for t in timeline_tracks(result) if t.name == "early stop"]
    assert [e.name for e in stop.events] == ["stop (nothing cut)"]
