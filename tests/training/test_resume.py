"""The journal's contract with the trainer: a group is durable before it is handed over;
after a restart on the same file, the groups handed after the last commit come back as
they were (nothing regenerated), committed ones never, prompts given and never handed come
back with their finished samples kept, and a committed step replays bit for bit."""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
import pytest

from miles_lite import SampleStatus
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import TextRule
from miles_lite.training import batch_digest, read_resume, replay_step, training_batch
from miles_lite.types import Sample

from .conftest import Journaled

pytestmark = pytest.mark.anyio


def prompts(n: int, start: int = 0) -> list[PromptGroup]:
    return [PromptGroup(prompt=f"count to {i}", metadata={"prompt_id": i}) for i in range(start, n)]


def tokens_of(groups: list[list[Sample]]) -> list[list[list[int]]]:
    return [[s.tokens for s in g] for g in groups]


async def test_a_restart_hands_back_what_followed_the_last_commit_and_nothing_before(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    taken: list[list[Sample]] = []
    async with (
        journaled(path) as (rollout, _),
        rollout.stream(prompts(6), max_ahead=2) as groups,
    ):
        async for group in groups:
            taken.append(group)
            # Durable before it came: a reader of the file sees it as handed.
            state = await anyio.to_thread.run_sync(read_resume, path)
            assert tokens_of(state.handed)[-1] == tokens_of([group])[0]
            if len(taken) == 2:
                batch = training_batch(taken)
                await rollout.commit(1, batch=batch)
                digest = batch_digest(batch)
            if len(taken) == 3:
                break  # the trainer dies here (the rest never handed)
    async with journaled(path) as (rollout, engine):
        state = await rollout.resume()
        assert state.step == 1
        assert tokens_of(state.handed) == tokens_of(taken[2:3])
        assert [s.reward for s in state.handed[0]] == [s.reward for s in taken[2]]
        assert state.given == frozenset(str(i) for i in range(6))
        assert sorted(state.committed_prompts) == sorted(
            str(g[0].metadata["prompt_id"]) for g in taken[:2]
        )
        assert engine.statistics().requests == ()  # nothing regenerated to resume
        pending_ids = sorted(g[0].metadata["prompt_id"] for g in state.pending)
        handed_ids = {g[0].metadata["prompt_id"] for g in taken}
        assert pending_ids == sorted(set(range(6)) - handed_ids)
        done_before = sum(s.status is SampleStatus.COMPLETED for g in state.pending for s in g)
        async with rollout.stream(state.pending, max_ahead=4) as groups:
            rest = [g async for g in groups]
        sent = len(engine.statistics().requests)
        # Only the samples not finished before the crash were sent again.
        assert sent == sum(len(g) for g in state.pending) - done_before
        assert sorted(g[0].metadata["prompt_id"] for g in rest) == pending_ids
        await rollout.commit(2)
    replay = await anyio.to_thread.run_sync(replay_step, path, 1)
    assert replay.matches and replay.digest == digest and replay.groups == 2
    final = await anyio.to_thread.run_sync(read_resume, path)
    assert final.handed == [] and final.pending == [] and final.step == 2
    assert sorted(final.committed_prompts) == sorted(str(i) for i in range(6))


async def test_run_hands_its_kept_groups_durably_and_resume_gives_them_back(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, _):
        result = await rollout.run(prompts(3))
    async with journaled(path) as (rollout, engine):
        state = await rollout.resume()
        assert state.step is None and state.pending == []
        assert tokens_of(state.handed) == tokens_of(result.groups)
        assert [[s.reward for s in g] for g in state.handed] == [
            [s.reward for s in g] for g in result.groups
        ]
        await rollout.commit(1, batch=training_batch(state.handed))
        assert engine.statistics().requests == ()
    replay = await anyio.to_thread.run_sync(replay_step, path, 1)
    assert replay.matches and replay.samples == 6
    assert replay.digest == batch_digest(training_batch(result.groups))


async def test_aborted_samples_are_journaled_and_resume_from_their_tokens(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    settings = {"rollout_batch_size": 1, "over_sampling_batch_size": 3}
    # The first prompt's short answer ends its group first: the stop aborts the others
    # with some of their 120 tokens made.
    first = (TextRule(r"count to 0", "zero, and done"),)
    async with journaled(
        path, answer_tokens=120, token_latency_s=0.01, rules=first, **settings
    ) as (rollout, _):
        result = await rollout.run(prompts(3))
    aborted = [s for g in result.partial for s in g if s.status is SampleStatus.ABORTED]
    assert aborted and all(s.response_length > 0 for s in aborted)
    state = await anyio.to_thread.run_sync(read_resume, path)
    resumed = {
        (s.metadata["prompt_id"], s.index % 2): s
        for g in state.pending
        for s in g
        if s.status is SampleStatus.ABORTED
    }
    # Every aborted sample is in the journal with the tokens it had.
    for s in aborted:
        kept = resumed[(s.metadata["prompt_id"], s.index % 2)]
        assert kept.tokens == s.tokens and kept.rollout_log_probs == s.rollout_log_probs
    async with journaled(path, answer_tokens=120, token_latency_s=0.0, **settings) as (
        rollout,
        _,
    ):
        state = await rollout.resume()
        assert len(state.handed) == 1
        finished: dict[tuple[int, int], Sample] = {}
        pending = state.pending
        while pending:  # one group kept per run: the others stop early again
            again = await rollout.run(pending)
            finished |= {(s.metadata["prompt_id"], s.index % 2): s for g in again.groups for s in g}
            pending = again.partial
    assert len(finished) == 4
    for key, before in resumed.items():
        after = finished[key]
        assert after.status in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
        assert after.tokens[: len(before.tokens)] == before.tokens  # extends its prefix
        assert after.response_length > before.response_length
