"""Real SIGKILLs: a trainer killed at seeded random points (generating, just handed a group,
training, committing, updating weights) and restarted on the same journal trains on every
prompt exactly once; a journal file killed mid-transaction (its writer process with the
trainer, or the trainer alone, its writer dying with it) reads back consistent."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from miles_lite import SampleStatus
from miles_lite.training import read_resume, read_step, replay_step
from miles_lite.training.codec import decode_samples
from miles_lite.training.reader import handed_group
from tests.support.processes import wait_gone

HERE = Path(__file__).resolve().parent
PROMPTS = 100


@pytest.mark.slow
def test_a_trainer_killed_24_times_trains_on_every_prompt_exactly_once(tmp_path: Path) -> None:
    journal = tmp_path / "run.db"
    command = [
        sys.executable,
        str(HERE / "crash_trainer.py"),
        *("--journal", str(journal), "--workdir", str(tmp_path)),
        *("--kills", "24", "--prompts", str(PROMPTS), "--seed", "7"),
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    kills = report["kills"]
    assert len(kills) == 24 and report["lives"] == 25
    assert {k["phase"] for k in kills} == {"generate", "handed", "train", "commit", "update"}

    # Every prompt trained on exactly once: the committed prompt ids are the dataset.
    state = read_resume(journal)
    assert state.handed == [] and state.pending == []
    assert Counter(state.committed_prompts) == Counter(str(i) for i in range(PROMPTS))

    # Replay of every step gives the digest the trainer saw (every time it trained it).
    seen: dict[int, set[str]] = {}
    for line in (tmp_path / "steps.jsonl").read_text().splitlines():
        record = json.loads(line)
        seen.setdefault(record["step"], set()).add(record["digest"])
    trained: list[tuple[str, int]] = []
    for step in sorted(seen):
        replay = replay_step(journal, step)
        assert replay.matches, step
        assert seen[step] <= {replay.digest}, step  # a step redone trained the same batch
        trained += [
            (str(s.metadata["prompt_id"]), s.index % 2)
            for g in read_step(journal, step).groups
            for s in g
        ]
    assert len(trained) == len(set(trained)) == 2 * PROMPTS  # no sample trained twice
    assert sorted(seen) == list(range(1, len(seen) + 1))

    with sqlite3.connect(journal) as conn:
        handed = {
            gid: (session, blob)
            for gid, session, blob in conn.execute(
                "SELECT gid, session, blob FROM handed WHERE step IS NOT NULL"
            )
        }
        records = conn.execute("SELECT gid, slot, attempt, status, blob FROM samples").fetchall()
        sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
    assert sessions == 25 and len(handed) == PROMPTS
    # No committed group generated again after it was handed.
    assert all(attempt >> 32 <= handed[gid][0] for gid, _, attempt, _, _ in records)
    # Every sample resumed from journaled partial tokens extends them.
    with sqlite3.connect(journal) as conn:
        final = {gid: handed_group(conn, gid, blob, 0) for gid, (_, blob) in handed.items()}
    extended = across_lives = 0
    for gid, slot, attempt, status, blob in records:
        if status != SampleStatus.ABORTED.value:
            continue
        (partial,) = decode_samples(blob)
        if partial.response_length == 0:
            continue
        done = final[gid][slot]
        assert done.tokens[: len(partial.tokens)] == partial.tokens
        assert done.response_length > partial.response_length
        extended += 1
        across_lives += attempt >> 32 < handed[gid][0]
    assert extended > 0
    print(json.dumps({"kills": len(kills), "resumed_partials": extended, "across": across_lives}))


_WRITER = """
import sys, anyio
from miles_lite.training import Journal
from miles_lite.types import Sample, SampleStatus

async def main(path):
    async with Journal(path) as journal:
        state = await journal.resume()
        step = state.step or 0
        if state.handed:  # handed before the kill: the step in flight commits them
            step += 1
            await journal.commit(step)
        print("ready", journal.writer.pid, flush=True)
        while True:
            groups = [[Sample(index=j, prompt=f"p{step}-{g}", metadata={"prompt_id": f"{step}-{g}"})
                       for j in range(4)] for g in range(3)]
            gids = journal.give(groups, rollout_id=step)
            refs = []
            for gid, group in zip(gids, groups):
                refs.append([])
                for s in group:
                    s.status = SampleStatus.COMPLETED
                    s.tokens = list(range(3000))
                    s.response_length = 2000
                    s.rollout_log_probs = [-0.5] * 2000
                    attempt = journal.next_attempt()
                    await journal.record(gid, s.index, attempt, [s])
                    refs[-1].append((s.index, attempt) if s.index % 2 else None)
            await journal.hand(list(zip(gids, groups, refs)))
            step += 1
            await journal.commit(step)

anyio.run(main, sys.argv[1])
"""


@pytest.mark.slow
def test_a_journal_killed_mid_transaction_reads_back_consistent(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    rng = random.Random(3)
    steps = []
    for life in range(6):
        with subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as child:
            assert child.stdout is not None
            ready, writer = child.stdout.readline().split()
            assert ready == "ready"
            time.sleep(rng.uniform(0.2, 0.6))  # mid-run: sample writes, hand-offs, commits
            if life % 2:
                # The trainer alone: its journal's writer process dies with it.
                child.send_signal(signal.SIGKILL)
                child.wait()
                wait_gone(int(writer))
            else:
                # The whole process group: the writer is killed mid-transaction too.
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                wait_gone(int(writer))
        state = read_resume(path)  # quick_check passes, nothing half-read
        assert state.step is not None
        # Each step committed in this life is whole: its three groups of four samples, as
        # written (an earlier life's were read after it).
        for step in range((steps or [0])[-1] + 1, state.step + 1):
            groups = read_step(path, step).groups
            assert [len(g) for g in groups] == [4, 4, 4]
            assert all(s.response_length == 2000 for g in groups for s in g)
        # Handed and not committed: only the groups of the one step in flight.
        assert len(state.handed) in (0, 3)
        steps.append(state.step)
    assert steps == sorted(steps) and steps[-1] > steps[0]
