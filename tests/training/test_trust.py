"""A journal is not trusted blindly: a file of another run is refused naming what differs,
a corrupt file is refused before anything is read, a full disk fails the rollout with a
typed error and leaves the file readable up to its last complete transaction, and an
older attempt's late answer never supersedes a newer one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio.to_thread
import pytest

from miles_lite import SampleStatus
from miles_lite.errors import JournalError
from miles_lite.rollout.groups import PromptGroup
from miles_lite.training import Journal, JournalConfig, read_resume
from miles_lite.training._schema import SCHEMA_VERSION
from miles_lite.types import Sample

from .conftest import Journaled

pytestmark = pytest.mark.anyio


def prompts(n: int) -> list[PromptGroup]:
    return [PromptGroup(prompt=f"count to {i}", metadata={"prompt_id": i}) for i in range(n)]


async def test_a_journal_of_another_config_is_refused_naming_the_field(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, _):
        await rollout.run(prompts(1))
    with pytest.raises(JournalError, match="n_samples_per_prompt: journal 2, now 3"):
        async with journaled(path, n_samples_per_prompt=3):
            pass
    # Engine settings are not the run's identity: another port, the same journal.
    async with journaled(path) as (rollout, _):
        assert len((await rollout.resume()).handed) == 1


async def test_a_prompt_id_given_with_another_prompt_is_refused(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, engine):
        await rollout.run(prompts(2))
        other = [PromptGroup(prompt="something else", metadata={"prompt_id": 1})]
        with pytest.raises(JournalError, match="prompt id '1' was journaled with another prompt"):
            await rollout.run(other)
        assert len(engine.statistics().requests) == 4  # nothing of it was sent


async def test_a_corrupt_file_is_refused_before_anything_is_read(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, _):
        await rollout.run(prompts(8))
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")  # the page size, from the file's header
    assert len(data) >= 6 * page
    data[3 * page : 3 * page + 512] = b"\xa5" * 512  # a torn page in the middle
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="corrupt"):
        async with Journal(path):
            pass
    with pytest.raises(JournalError, match="corrupt"):
        await anyio.to_thread.run_sync(read_resume, path)
    path.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(JournalError, match="corrupt"):
        async with Journal(path):
            pass


async def test_a_journal_of_another_schema_version_is_refused_naming_both(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, _):
        await rollout.run(prompts(1))
    with sqlite3.connect(path) as conn:  # as a miles_lite of the keyed records left it
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    with pytest.raises(
        JournalError, match=f"schema version 1, this miles_lite writes {SCHEMA_VERSION}"
    ):
        async with Journal(path):
            pass
    with pytest.raises(JournalError, match="schema version 1"):
        await anyio.to_thread.run_sync(read_resume, path)


async def test_a_full_disk_fails_the_rollout_and_keeps_what_was_complete(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with (
        Journal(path, JournalConfig(max_bytes=640 * 1024)) as journal,
        journaled(journal, answer_tokens=200, token_latency_s=0.0) as (rollout, _),
    ):
        first = await rollout.run(prompts(2))
        await rollout.commit(1)
        with pytest.raises(JournalError, match="is full"):
            for _ in range(100):  # ~4 KB a sample: the 640 KiB fill up
                await rollout.run(prompts(2))
        assert journal.statistics().transactions > 0
    state = await anyio.to_thread.run_sync(read_resume, path)  # checked, readable
    assert state.step == 1
    assert sorted(state.committed_prompts) == ["0", "1"]
    assert [len(g) for g in first.groups] == [2, 2]


async def test_an_older_attempt_answering_late_never_supersedes_a_newer_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.db"
    async with Journal(path) as journal:
        group = [Sample(index=j, prompt="p", seed=7 + j) for j in range(2)]
        (gid,) = journal.give([group], rollout_id=0)
        older, newer = journal.next_attempt(), journal.next_attempt()
        new = Sample(
            index=0,
            prompt="p",
            status=SampleStatus.COMPLETED,
            tokens=[1, 2, 3],
            response_length=2,
            rollout_log_probs=[-0.5, -0.25],
        )
        old = Sample(
            index=0, prompt="p", status=SampleStatus.ABORTED, tokens=[1, 9], response_length=1
        )
        await journal.record(gid, 0, newer, [new])
        await journal.record(gid, 0, older, [old])  # the late answer of the older attempt
        state = await journal.resume()
    (pending,) = state.pending
    assert pending[0].tokens == [1, 2, 3] and pending[0].status is SampleStatus.COMPLETED
    assert pending[1].status is SampleStatus.PENDING and pending[1].seed == 8
    async with Journal(path) as journal:  # a later session's attempts are above
        assert journal.next_attempt() > newer


async def test_a_full_queue_holds_the_generate_calls_back_and_loses_nothing(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with (
        Journal(path, JournalConfig(queue_size=1)) as journal,
        journaled(journal, answer_tokens=64, token_latency_s=0.0) as (rollout, _),
    ):
        result = await rollout.run(prompts(8))
        stats = journal.statistics()
    metrics = result.metrics
    assert metrics["journal/blocked_puts"] == stats.blocked_puts
    assert metrics["journal/samples_written"] >= 16  # each recorded sample (and hand-offs)
    state = await anyio.to_thread.run_sync(read_resume, path)
    assert [[s.tokens for s in g] for g in state.handed] == [
        [s.tokens for s in g] for g in result.groups
    ]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM samples").fetchone()[0] == 16
