"""A rollout's picture: the Chrome/Perfetto trace has a track per engine slot and per pool
worker, one slot never holds two generations at once, and the PNG is drawn."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from miles_lite import PromptGroup, TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rewards.text_rewards import math_reward
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.trace import timeline_tracks, write_timeline_png, write_trace
from miles_lite.testing import TextPolicy, TextRule, TextStandInConfig, TextStandInEngine

SLOTS = 3
RULE = TextRule(r"What is 2\+3", "It is \\boxed{5}.", alternatives=("It is \\boxed{6}.",))


async def early_stopped_rollout(tokenizer: Any, engines: int = 2) -> RolloutResult:
    config = TextStandInConfig(policy=TextPolicy(rules=[RULE]), token_latency_s=0.01)
    rollout_config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=16),
        reward="math",
        rollout_batch_size=2,
        over_sampling_batch_size=4,
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=SLOTS)),
    )
    async with TextStandInEngine(config, tokenizer) as a, TextStandInEngine(config, tokenizer) as b:
        urls = [a.url, b.url][:engines]
        async with TextRollout.open(
            urls, tokenizer=tokenizer, config=rollout_config, rewards={"math": math_reward}
        ) as rollout:
            prompts = [PromptGroup(prompt="What is 2+3?", label="5") for _ in range(6)]
            return await rollout.run(prompts)


@pytest.mark.anyio
async def test_the_trace_has_a_track_per_engine_slot_and_pool_worker(
    tokenizer: Any, tmp_path: Path
) -> None:
    result = await early_stopped_rollout(tokenizer)
    path = await anyio.to_thread.run_sync(write_trace, result, tmp_path / "t.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    groups = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slots: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in events:
        if event["ph"] == "X":
            assert event["ts"] >= 0 and event["dur"] >= 0 and {"pid", "tid", "name"} <= set(event)
        if event["ph"] == "X" and groups[event["pid"]].startswith("engine "):
            assert event["name"].startswith("generate")
            slots.setdefault((event["pid"], event["tid"]), []).append(
                (event["ts"], event["ts"] + event["dur"])
            )
    engines = {g for g in groups.values() if g.startswith("engine ")}
    assert engines == {f"engine {url}" for url in result.engines} and len(engines) == 2
    # One slot never holds two generations at once, and no engine has more than its slots.
    for intervals in slots.values():
        intervals.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(intervals))
    for pid in {pid for pid, _ in slots}:
        assert len([k for k in slots if k[0] == pid]) <= SLOTS
    assert {names[k] for k in slots} <= {f"slot {i}" for i in range(SLOTS)}
    assert "reward math" in groups.values()
    assert any(
        n.startswith("worker 0") for (pid, _), n in names.items() if groups[pid] == "reward math"
    )
    # The early stop is on the rollout's track, and the aborted generations say so.
    kinds = {e["name"] for e in events if e["ph"] == "X"}
    assert {"rollout", "early stop (abort, drain)", "reward"} <= kinds
    assert result.metrics["rollout/kept_groups"] == 2 and result.partial
    assert trace["otherData"]["metrics"]["rollout/kept_groups"] == 2


@pytest.mark.anyio
async def test_an_idle_engine_still_has_its_track_and_the_png_is_drawn(
    tokenizer: Any, tmp_path: Path
) -> None:
    result = await early_stopped_rollout(tokenizer, engines=1)
    result.engines = (*result.engines, "http://127.0.0.1:9")  # an engine that got no work
    tracks = timeline_tracks(result)
    idle = [t for t in tracks if t.group == "engine http://127.0.0.1:9"]
    assert len(idle) == 1 and idle[0].events == [] and idle[0].name == "slot 0"
    png = await anyio.to_thread.run_sync(write_timeline_png, result, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
