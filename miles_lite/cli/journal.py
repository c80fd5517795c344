"""``miles-lite journal``: a rollout journal read back, with no engine (but ``audit``).

- ``show run.db``: groups by verdict, statuses, weight versions, and per committed step its
  groups, samples, reward mean and batch digest;
- ``export run.db --out samples.jsonl``: one JSON line per handed sample (step, group,
  prompt id, index, status, reward, tokens, response length, loss mask, log-probs,
  versions); ``--out samples.parquet``: the same rows as Parquet (list columns; needs
  pyarrow, the ``parquet`` extra);
- ``replay run.db --step N``: the training batch of step N rebuilt, its digest against the
  one journaled at commit (exit 1 when they differ);
- ``audit run.db --engine URL``: the journaled tokens re-scored on a live engine,
  ``|delta log-prob|`` per weight version.

Each prints a table (``--json``: one JSON line). A journal that cannot be read ends in one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from miles_lite.errors import JournalError, MilesLiteError

__all__ = ["add_journal_parser", "run"]


def add_journal_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``journal`` and its actions on the CLI's subparsers."""
    journal = sub.add_parser(
        "journal",
        help="show, export, replay or audit a rollout journal (run.db)",
        description="Reads a rollout journal (TextRollout.open(..., journal='run.db')):"
        " summary, JSONL or Parquet export, bit-identical replay of a step's training batch, and a"
        " re-scoring of its tokens on a live engine.",
    )
    journal.add_argument("action", choices=["show", "export", "replay", "audit"])
    journal.add_argument("path", type=Path, help="the journal file")
    journal.add_argument("--step", type=int, default=None, help="replay: the committed step")
    journal.add_argument(
        "--out", type=Path, default=None, help="export: the .jsonl or .parquet file"
    )
    journal.add_argument("--engine", default=None, help="audit: the engine URL (http://...)")
    journal.add_argument("--limit", type=int, default=None, help="audit: samples at most")
    journal.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    return journal  # type: ignore[no-any-return]


def run(args: argparse.Namespace, **_: Any) -> int:
    """Run ``miles-lite journal ACTION``; the exit status."""
    try:
        if not args.path.is_file():
            raise JournalError(f"no journal at {args.path}")
        action = {"show": _show, "export": _export, "replay": _replay, "audit": _audit}
        return action[args.action](args)
    except MilesLiteError as exc:
        print(f"miles-lite journal {args.action}: {exc}", file=sys.stderr)
        return 2


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _reward(value: Any) -> float | None:
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, int | float)), None)
    return float(value) if isinstance(value, int | float) else None


def summary(path: Path) -> dict[str, Any]:
    """What ``show`` prints, as a dict."""
    from miles_lite.training.reader import iter_handed, open_reader

    conn = open_reader(path)
    try:
        verdicts = dict(
            conn.execute("SELECT coalesce(verdict, 'open'), count(*) FROM groups GROUP BY 1")
        )
        steps = {
            step: {"groups": groups, "digest": digest}
            for step, groups, digest in conn.execute("SELECT step, groups, digest FROM steps")
        }
        sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        statuses: Counter[str] = Counter()
        versions: Counter[str] = Counter()
        rewards: dict[int | None, list[float]] = {}
        samples: Counter[int | None] = Counter()
        for _, _, step, group in iter_handed(conn):
            for sample in group:
                statuses[sample.status.value] += 1
                samples[step] += 1
                for span in sample.weight_spans:
                    versions[span.version] += span.end - span.start
                reward = _reward(sample.reward)
                if reward is not None:
                    rewards.setdefault(step, []).append(reward)
    finally:
        conn.close()
    for step, row in steps.items():
        row["samples"] = samples.get(step, 0)
        row["reward_mean"] = _mean(rewards.get(step, []))
    return {
        "sessions": sessions,
        "groups": verdicts,
        "statuses": dict(statuses),
        "tokens_per_version": dict(versions),
        "handed_uncommitted": samples.get(None, 0),
        "steps": {str(k): steps[k] for k in sorted(steps)},
    }


def _show(args: argparse.Namespace) -> int:
    info = summary(args.path)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"journal {args.path}: {info['sessions']} session(s)")
    print("groups:   " + ", ".join(f"{k} {v}" for k, v in sorted(info["groups"].items())))
    print("samples:  " + ", ".join(f"{k} {v}" for k, v in sorted(info["statuses"].items())))
    print(
        "versions: " + ", ".join(f"{k}: {v} tokens" for k, v in info["tokens_per_version"].items())
    )
    print(f"{'step':>6} {'groups':>6} {'samples':>7} {'reward':>8}  digest")
    for step, row in info["steps"].items():
        reward = "-" if row["reward_mean"] is None else f"{row['reward_mean']:.4f}"
        print(
            f"{step:>6} {row['groups']:>6} {row['samples']:>7} {reward:>8}"
            f"  {(row['digest'] or '-')[:16]}"
        )
    return 0


def _export_rows(path: Path) -> list[dict[str, Any]]:
    """One row per handed sample, in hand-off order (what ``export`` writes)."""
    from miles_lite.training.reader import iter_handed, open_reader

    conn = open_reader(path)
    rows: list[dict[str, Any]] = []
    try:
        for gid, prompt_id, step, group in iter_handed(conn):
            for sample in group:
                log_probs = sample.rollout_log_probs
                mask = sample.loss_mask
                rows.append(
                    {
                        "step": step,
                        "group": gid,
                        "prompt_id": prompt_id,
                        "index": sample.index,
                        "status": sample.status.value,
                        "reward": sample.reward,
                        "tokens": sample.tokens,
                        "response_length": sample.response_length,
                        "loss_mask": list(mask) if mask is not None else None,
                        "rollout_log_probs": log_probs if isinstance(log_probs, list) else None,
                        "weight_spans": [[w.version, w.start, w.end] for w in sample.weight_spans],
                    }
                )
    finally:
        conn.close()
    return rows


def _parquet_schema() -> Any:
    """The Parquet columns of an exported row: list columns for tokens, mask and
    log-probs; a reward that is not one number (a dict of them) is kept as its JSON text
    in ``reward_json``."""
    import pyarrow as pa

    span = pa.struct([("version", pa.string()), ("start", pa.int64()), ("end", pa.int64())])
    return pa.schema(
        [
            ("step", pa.int64()),
            ("group", pa.int64()),
            ("prompt_id", pa.string()),
            ("index", pa.int64()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("reward_json", pa.string()),
            ("tokens", pa.list_(pa.int64())),
            ("response_length", pa.int64()),
            ("loss_mask", pa.list_(pa.int64())),
            ("rollout_log_probs", pa.list_(pa.float64())),
            ("weight_spans", pa.list_(span)),
        ]
    )


def _write_parquet(rows: list[dict[str, Any]], out: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise JournalError(
            f"exporting to {out} (Parquet) needs pyarrow: pip install 'miles-lite[parquet]'"
            " (or pip install 'pyarrow>=14')"
        ) from exc
    columns: dict[str, list[Any]] = {name: [] for name in _parquet_schema().names}
    for row in rows:
        reward = row["reward"]
        number = isinstance(reward, int | float) and not isinstance(reward, bool)
        for name in columns:
            if name == "reward":
                columns[name].append(float(reward) if number else None)
            elif name == "reward_json":
                columns[name].append(None if number or reward is None else json.dumps(reward))
            elif name == "weight_spans":
                columns[name].append(
                    [{"version": v, "start": a, "end": b} for v, a, b in row[name]]
                )
            else:
                columns[name].append(row[name])
    pq.write_table(pa.table(columns, schema=_parquet_schema()), out)


def _export(args: argparse.Namespace) -> int:
    out = args.out or args.path.with_suffix(".jsonl")
    rows = _export_rows(args.path)
    if out.suffix == ".parquet":
        _write_parquet(rows, out)
    else:
        with out.open("w") as file:
            for row in rows:
                file.write(json.dumps(row) + "\n")
    lines = len(rows)
    print(
        json.dumps({"out": str(out), "samples": lines})
        if args.json
        else f"{lines} samples -> {out}"
    )
    return 0


def _replay(args: argparse.Namespace) -> int:
    from miles_lite.training.replay import replay_step

    if args.step is None:
        raise JournalError("journal replay needs --step N (a committed step)")
    replay = replay_step(args.path, args.step)
    record = {
        "step": replay.step,
        "groups": replay.groups,
        "samples": replay.samples,
        "digest": replay.digest,
        "journaled": replay.journaled,
        "matches": replay.matches,
    }
    if args.json:
        print(json.dumps(record))
    else:
        verdict = "bit-identical" if replay.matches else "DIFFERS from the journaled digest"
        print(
            f"step {replay.step}: {replay.groups} groups, {replay.samples} samples,"
            f" batch {replay.digest[:16]}: {verdict} ({(replay.journaled or 'none')[:16]})"
        )
    return 0 if replay.matches else 1


def _audit(args: argparse.Namespace) -> int:
    import anyio

    from miles_lite.training.audit import audit_journal

    if not args.engine:
        raise JournalError("journal audit needs --engine URL (a running engine)")
    found = anyio.run(lambda: audit_journal(args.path, args.engine, limit=args.limit))
    rows = [
        {
            "version": a.version,
            "tokens": a.tokens,
            "samples": a.samples,
            "max": a.max,
            "mean": a.mean,
        }
        for a in found
    ]
    if args.json:
        print(json.dumps({"engine": args.engine, "versions": rows}))
        return 0
    print(f"{'version':>10} {'samples':>8} {'tokens':>8} {'max |d|':>10} {'mean |d|':>10}")
    for row in rows:
        print(
            f"{row['version']:>10} {row['samples']:>8} {row['tokens']:>8}"
            f" {row['max']:>10.3g} {row['mean']:>10.3g}"
        )
    return 0
