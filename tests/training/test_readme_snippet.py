"""The README's "Surviving a crash" loop runs as written on a stand-in: a trainer that dies
between its step and its commit resumes, redoes that step on the very groups it had (the
same batch digest), and trains every prompt once."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextPolicy, TextStandInConfig, TextStandInEngine
from miles_lite.training import batch_digest, read_resume, replay_step, training_batch

from .conftest import Parity

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet() -> str:
    section = README.read_text().split("## Surviving a crash\n", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    line = '                            journal="run.db") as rollout:'
    assert line in code, "the README's open line changed"
    return code.replace(line, "                            journal=JOURNAL) as rollout:")


class Died(Exception):
    """The trainer's process dying, between its step and its commit."""


async def test_the_readme_crash_loop_resumes_and_redoes_the_interrupted_step(
    tmp_path: Path, tokenizer: Any
) -> None:
    code = compile(snippet(), str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    trained: list[str] = []  # the batch digest each time a step trained
    checkpoints: list[int] = []

    def train(data: Any) -> None:
        trained.append(batch_digest(data))

    def save_checkpoint(step: int) -> None:
        if step == 2 and step not in checkpoints:
            checkpoints.append(step)
            raise Died  # dies once, after training step 2, before committing it
        checkpoints.append(step)

    engine_config = TextStandInConfig(policy=TextPolicy(default_length=6))
    async with TextStandInEngine(engine_config, tokenizer) as engine:
        namespace: dict[str, Any] = {
            "TextRollout": TextRollout,
            "PromptGroup": PromptGroup,
            "training_batch": training_batch,
            "urls": [engine.url],
            "tok": tokenizer,
            "config": TextRolloutConfig(
                n_samples_per_prompt=2,
                sampling=TextSamplingParams(max_new_tokens=8),
                reward="parity",
            ),
            "rewards": {"parity": Parity()},
            "dataset": [f"count to {i}" for i in range(6)],
            "groups_per_step": 2,
            "train": train,
            "save_checkpoint": save_checkpoint,
            "JOURNAL": tmp_path / "run.db",
        }
        with pytest.raises(Died):
            await eval(code, dict(namespace))
        sent = len(engine.statistics().requests)
        await eval(code, dict(namespace))
    path = tmp_path / "run.db"
    state = await anyio.to_thread.run_sync(read_resume, path)
    assert state.step == 3 and state.handed == [] and state.pending == []
    assert Counter(state.committed_prompts) == Counter(str(i) for i in range(6))
    # Step 2 trained twice, on the same batch; nothing of it was generated again.
    assert len(trained) == 4 and trained[1] == trained[2]
    assert len(engine.statistics().requests) - sent <= 2 * 6 - 2 * 4
    for step, digest in ((1, trained[0]), (2, trained[2]), (3, trained[3])):
        replay = await anyio.to_thread.run_sync(replay_step, path, step)
        assert replay.matches and replay.digest == digest
