"""The README's snippets run on the stand-ins and show what their text claims.

Each ```python block runs as written, top-level ``await`` included (a notebook cell), or
as a script in a thread of its own (``run_sync``, as pasted into a file), with only the lines
that name the user's own things (engine URLs, a tokenizer or CLIP checkpoint path) pointed
at stand-ins; a substitution that no longer matches the README fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from miles_lite.rollout.spans import UnitSpan
from miles_lite.testing import (
    StandInConfig,
    StandInEngine,
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def block(heading: str, index: int = 0) -> str:
    """The ``index``-th python block under ``## heading``."""
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[index]


def pointed(code: str, **lines: str) -> str:
    """``code`` with each line starting with a key's text replaced by its value."""
    out = code.splitlines()
    for start, replacement in lines.items():
        found = [i for i, line in enumerate(out) if line.lstrip().startswith(start)]
        assert found, f"the README no longer has a line starting with {start!r}"
        for i in found:
            indent = out[i][: len(out[i]) - len(out[i].lstrip())]
            out[i] = indent + replacement
    return "\n".join(out)


async def run(code: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    coroutine = eval(compiled, namespace)  # top-level await: a coroutine to await
    if coroutine is not None:
        await coroutine


async def run_as_script(code: str, namespace: dict[str, Any]) -> None:
    """``code`` as a script runs it: in a thread with no event loop (``run_sync`` refuses
    a running one), while this loop serves the stand-ins."""
    compiled = compile(code, str(README), "exec")
    await asyncio.to_thread(exec, compiled, namespace)


@pytest.mark.timeout(300)
def test_the_diffusion_snippet_runs_and_returns_what_it_says(tmp_path: Path) -> None:
    from miles_lite.rewards.tiny_clip import tiny_clip

    clip_config, clip_tokenizer = tiny_clip(tmp_path)
    code = pointed(
        block("In a notebook or a script"),
        **{
            "urls = ": "urls = URLS",
            "reward = ClipReward(": "reward = ClipReward(config=CLIP, tokenizer=CLIP_TOKENIZER)",
        },
    )
    namespace: dict[str, Any] = {"CLIP": clip_config, "CLIP_TOKENIZER": clip_tokenizer}

    async def main() -> None:
        async with StandInEngine(StandInConfig()) as a, StandInEngine(StandInConfig()) as b:
            namespace["URLS"] = [a.url, b.url]
            await run(code, namespace)

    asyncio.run(main())
    result = namespace["result"]
    assert [len(g) for g in result.groups] == [8, 8] and not result.failed
    assert all([s.index for s in g] == sorted(s.index for s in g) for g in result.groups)
    assert {"perf/rollout_time", "perf/parser_max_queue_depth"} <= set(result.metrics)
    assert "perf/reward_max_queue_depth_pickscore" in result.metrics
    assert all(isinstance(s.reward, float) for s in result.samples)
    assert len(result.spans) == 4 and all(isinstance(s, UnitSpan) for s in result.spans)
    assert all(s.generate_end and s.deserialize_end and s.reward_end for s in result.spans)


def arithmetic_policy() -> TextPolicy:
    """Answers the snippet's "What is i + i?": always right for every 6th question (the
    group's rewards agree: drop_zero_std drops it), else right or off by one per seed."""
    rules = [TextRule(r"What is 2 \+ 3\?", "It is \\boxed{5}.")]
    for i in range(32):
        right = f"{i} + {i} = {2 * i}, so \\boxed{{{2 * i}}}."
        wrong = () if i % 6 == 0 else (f"{i} + {i} = {2 * i + 1}, so \\boxed{{{2 * i + 1}}}.",)
        rules.append(TextRule(rf"What is {i} \+ {i}\?", right, alternatives=wrong))
    return TextPolicy(rules=rules)


@pytest.mark.timeout(300)
def test_the_text_agent_and_picture_snippets_run_and_do_what_they_say(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the picture snippet writes into the current folder
    text = pointed(
        block("Text rollouts"),
        **{
            "urls = ": "urls = URLS",
            "tokenizer = ": "tokenizer = TOKENIZER",
            "result = await rollout.run(prompts[:16])": "result = FIRST = await rollout.run(prompts[:16])",
        },
    )
    namespace: dict[str, Any] = {"TOKENIZER": tokenizer}
    engine_config = TextStandInConfig(policy=arithmetic_policy(), token_latency_s=0.001)

    async def main() -> None:
        async with TextStandInEngine(engine_config, tokenizer) as engine:
            namespace["URLS"] = [engine.url]
            await run(text, namespace)
            namespace["SECOND"] = namespace["result"]
            # Served in this process: the default (worker processes) runs the same agent
            # next to it in tests/agentic/test_server_modes.py, samples compared.
            agents = pointed(
                block("Agents: OpenAI chat through session URLs"),
                **{
                    "generate=AgentGenerate(": "generate=AgentGenerate(run_agent,"
                    " sessions=SessionServerConfig(idle_ttl_s=300, processes=0)),"
                },
            )
            await run_as_script(agents, namespace)

    asyncio.run(main())
    first, second = namespace["FIRST"], namespace["SECOND"]
    # The first rollout keeps 8 groups whose rewards differ, drops some whose rewards all
    # agree, and hands back the rest; the second resumes those first and keeps 8 more.
    assert first.metrics["rollout/kept_groups"] == 8
    assert first.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] >= 1
    assert "drop_zero_std_1.0" in first.filter_reasons
    assert first.summary().startswith("rollout 0: kept 8 of 8 groups; filtered ")
    assert first.partial and len(first.partial) + first.metrics["rollout/started_groups"] >= 16
    # Trial sizes: 4 samples a group, 256 new tokens at most, no reward pool given by hand.
    assert all(len(g) == 4 for g in first.groups)
    assert all(s.response_length <= 256 for s in first.samples)
    # Samples aborted with partial output (the same objects come back in the second run).
    resumed = [s for g in first.partial for s in g if s.status.value == "aborted" and s.response]
    assert second.metrics["rollout/kept_groups"] == 8
    assert all(len(g) == 4 for g in second.groups)
    assert len({s.reward for g in second.groups for s in g}) == 2  # right and wrong answers
    finished = [s for s in resumed if s.status.value == "completed"]
    # They continued where they stopped: one answer each, not a second one after the first.
    assert all(s.response.count("boxed{") == 1 for s in finished), [s.response for s in finished]
    agent = namespace["result"]
    assert len(agent.samples) == 4 and {s.reward for s in agent.samples} == {1.0}
    assert all(s.loss_mask and sum(s.loss_mask) > 0 for s in agent.samples)
    # The picture snippet, on the text rollout it was written for.
    namespace["result"] = second
    asyncio.run(run(block("A picture of every rollout"), namespace))
    assert (tmp_path / "rollout.trace.json").stat().st_size > 0
    assert (tmp_path / "rollout.png").stat().st_size > 10_000
