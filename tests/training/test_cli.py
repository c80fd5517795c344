"""``miles-lite journal``: show, export, replay (bit-identical, no engine) and audit (the
journaled tokens re-scored on a live engine, |delta log-prob| per weight version)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from miles_lite.cli import main
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import token_logprob
from miles_lite.training import batch_digest, training_batch

from .conftest import Journaled

pytestmark = pytest.mark.anyio


def cli(*argv: str) -> int:
    return main(["journal", *argv])


async def test_show_export_replay_and_audit_a_journal(
    tmp_path: Path, journaled: Journaled, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.db"
    prompts = [PromptGroup(prompt=f"p {i}", metadata={"prompt_id": i}) for i in range(4)]
    async with journaled(path) as (rollout, engine):
        first = await rollout.run(prompts[:2])
        await rollout.commit(1, batch=training_batch(first.groups))
        second = await rollout.run(prompts[2:])
        await rollout.commit(2, batch=training_batch(second.groups, pack=True))
        handed = [s for r in (first, second) for g in r.groups for s in g]

        # audit, against the live stand-in (in a process of its own, as a user runs it)
        done = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "miles_lite.cli",
                "journal",
                "audit",
                str(path),
                "--engine",
                engine.url,
                "--json",
            ],
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (row,) = json.loads(done.stdout)["versions"]
    # The stand-in scores position i of a sequence token_logprob(-i, t); the journaled
    # log-probs are its output's, token_logprob(k, t) at response offset k.
    expected = [
        abs(token_logprob(-(len(s.tokens) - s.response_length + k), t) - s.rollout_log_probs[k])
        for s in handed
        for k, t in enumerate(s.tokens[len(s.tokens) - s.response_length :])
    ]
    assert row["version"] == "default" and row["samples"] == 8
    assert row["tokens"] == len(expected)
    assert row["max"] == pytest.approx(max(expected)) and row["mean"] == pytest.approx(
        sum(expected) / len(expected)
    )

    capsys.readouterr()
    assert await anyio.to_thread.run_sync(cli, "show", str(path), "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["groups"] == {"handed": 4} and info["statuses"] == {"completed": 8}
    assert list(info["steps"]) == ["1", "2"]
    assert info["steps"]["1"]["samples"] == 4
    rewards = [s.reward for g in first.groups for s in g]
    assert info["steps"]["1"]["reward_mean"] == pytest.approx(sum(rewards) / 4)

    for step, groups, pack in ((1, first.groups, False), (2, second.groups, True)):
        assert (
            await anyio.to_thread.run_sync(cli, "replay", str(path), "--step", str(step), "--json")
            == 0
        )
        replay = json.loads(capsys.readouterr().out)
        assert replay["matches"] and replay["digest"] == batch_digest(
            training_batch(groups, pack=pack)
        )
    assert await anyio.to_thread.run_sync(cli, "replay", str(path), "--step", "3") == 2
    assert "no committed step 3" in capsys.readouterr().err

    out = tmp_path / "samples.jsonl"
    assert await anyio.to_thread.run_sync(cli, "export", str(path), "--out", str(out)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["prompt_id"]) for r in rows] == [
        (1, "0"),
        (1, "0"),
        (1, "1"),
        (1, "1"),
        (2, "2"),
        (2, "2"),
        (2, "3"),
        (2, "3"),
    ]
    assert [r["tokens"] for r in rows] == [s.tokens for s in handed]
    assert [r["rollout_log_probs"] for r in rows] == [s.rollout_log_probs for s in handed]

    assert await anyio.to_thread.run_sync(cli, "show", str(tmp_path / "nope.db")) == 2
    assert "no journal at" in capsys.readouterr().err


async def test_export_parquet_holds_the_jsonl_rows(
    tmp_path: Path, journaled: Journaled, capsys: pytest.CaptureFixture[str]
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "run.db"
    prompts = [PromptGroup(prompt=f"p {i}", metadata={"prompt_id": i}) for i in range(3)]
    async with journaled(path) as (rollout, _):
        first = await rollout.run(prompts[:2])
        await rollout.commit(1, batch=training_batch(first.groups))
        second = await rollout.run(prompts[2:])  # handed, not committed: step None
    handed = [s for r in (first, second) for g in r.groups for s in g]

    jsonl, parquet = tmp_path / "x.jsonl", tmp_path / "x.parquet"
    for out in (jsonl, parquet):
        assert await anyio.to_thread.run_sync(cli, "export", str(path), "--out", str(out)) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"6 samples -> {jsonl}",
        f"6 samples -> {parquet}",
    ]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    table = pq.read_table(parquet).to_pylist()
    assert len(rows) == len(table) == 6
    assert [r["loss_mask"] for r in rows] == [s.loss_mask for s in handed]
    assert [r["step"] for r in rows] == [1, 1, 1, 1, None, None]
    for row, back in zip(rows, table, strict=True):
        assert back.pop("reward_json") is None
        back["weight_spans"] = [[w["version"], w["start"], w["end"]] for w in back["weight_spans"]]
        assert back == row
    # list columns, not JSON text
    schema = pq.read_schema(parquet)
    for name, value_type in (("tokens", "int64"), ("loss_mask", "int64")):
        assert str(schema.field(name).type.value_type) == value_type
    assert str(schema.field("rollout_log_probs").type.value_type) == "double"


async def test_export_parquet_without_pyarrow_names_the_extra(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    async with journaled(path) as (rollout, _):
        await rollout.run([PromptGroup(prompt="p", metadata={"prompt_id": 0})])
    out = tmp_path / "x.parquet"
    # A process of its own in which pyarrow cannot be imported (as on a base install).
    code = (
        "import sys; sys.modules['pyarrow'] = None; from miles_lite.cli import main;"
        f" sys.exit(main(['journal', 'export', {str(path)!r}, '--out', {str(out)!r}]))"
    )
    done = await anyio.run_process([sys.executable, "-c", code], check=False)
    assert done.returncode == 2
    err = done.stderr.decode().strip().splitlines()
    assert len(err) == 1 and "pip install 'miles-lite[parquet]'" in err[0] and str(out) in err[0]
    assert not out.exists()
