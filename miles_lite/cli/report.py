"""What a command prints after a rollout: the metrics table, what a sample looks like, and
where its trace and timeline went."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.trace import write_timeline_png, write_trace
from miles_lite.types import Sample

__all__ = ["report", "say_startup_steps", "show_sample", "write_pictures"]

#: Rows of a text sample shown around the start of its response.
_ROWS = 24


def say_startup_steps() -> None:
    """Print the library's start-up steps (what each does, how long it took) on stderr."""
    logger = logging.getLogger("miles_lite.startup")
    if not any(getattr(h, "_miles_lite_cli", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("  %(message)s"))
        handler._miles_lite_cli = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def metrics_with_reward(result: RolloutResult) -> dict[str, float]:
    """``result.metrics`` and the kept samples' mean reward (``rollout/reward_mean``)."""
    metrics = dict(result.metrics)
    rewards = [s.reward for s in result.samples if isinstance(s.reward, int | float)]
    if rewards:
        metrics["rollout/reward_mean"] = float(sum(rewards)) / len(rewards)
    return metrics


def show_sample(sample: Sample, tokenizer: Any = None) -> str:
    """A sample as text: a text one's response tokens, loss mask and log-probs side by
    side (the first rows); a diffusion one's latents."""
    head = (
        f"sample {sample.index} (group {sample.group_index}): {sample.status.value}"
        f"{f' ({sample.status_reason})' if sample.status_reason else ''}, reward {sample.reward}"
    )
    trajectory = sample.dit_trajectory
    if trajectory is not None and trajectory.latents is not None:
        latents = trajectory.latents
        return f"{head}\n  seed {sample.seed}, latents {list(latents.shape)} {latents.dtype}"
    prompt_len = len(sample.tokens) - sample.response_length
    lines = [head, f"  prompt {prompt_len} tokens, response {sample.response_length} tokens"]
    lines.append(f"  {'pos':>4}  {'token':>7}  {'mask':>4}  {'log-prob':>8}  text")
    mask = sample.loss_mask or []
    log_probs = list(sample.rollout_log_probs or [])
    response = sample.tokens[prompt_len:]
    last = -1
    for i in _rows(mask, len(response)):
        if i != last + 1:
            lines.append(f"  {'...':>4}")
        last = i
        text = tokenizer.decode([response[i]]) if tokenizer is not None else ""
        text = text.replace("\n", "\\n")
        lines.append(
            f"  {i:>4}  {response[i]:>7}  {mask[i]:>4}  {float(log_probs[i]):>8.3f}  {text}"
        )
    if last < len(response) - 1:
        lines.append(f"  ... {len(response) - 1 - last} more")
    return "\n".join(lines)


def _rows(mask: list[int], n: int) -> list[int]:
    """The response positions to show: the first ones, and a few around each place where
    the loss mask changes (a tool result between the model's turns), at most ``_ROWS``."""
    rows = set(range(min(n, 8)))
    for i in range(1, min(n, len(mask))):
        if mask[i] != mask[i - 1]:
            rows.update(range(max(0, i - 3), min(n, i + 5)))
    if len(rows) < _ROWS:
        rows.update(range(min(n, _ROWS - len(rows) + 8)))
    return sorted(rows)[:_ROWS]


def write_pictures(
    result: RolloutResult, trace: str | Path | None, timeline: str | Path | None
) -> dict[str, str]:
    """Write the trace and the PNG timeline where asked; their paths by kind (a PNG that
    needs matplotlib is skipped with a note on stderr)."""
    written: dict[str, str] = {}
    if trace is not None:
        written["trace"] = str(write_trace(result, trace))
    if timeline is not None:
        try:
            written["timeline"] = str(write_timeline_png(result, timeline))
        except ModuleNotFoundError as exc:
            print(f"  timeline skipped: {exc}", file=sys.stderr)
    return written


def report(
    name: str,
    result: RolloutResult,
    *,
    as_json: bool,
    pictures: dict[str, str],
    tokenizer: Any = None,
) -> None:
    """Print ``result``: one JSON line (its ``summary`` included), or the run's summary
    in words (:meth:`RolloutResult.summary`), the metrics table, a sample, failures and
    where the pictures are."""
    metrics = metrics_with_reward(result)
    summary = result.summary()
    if as_json:
        line = {"kind": name, "summary": summary, "metrics": metrics, **pictures}
        print(json.dumps(line, sort_keys=True))
        return
    width = max((len(k) for k in metrics), default=6)
    print(f"\n== {name} ==")
    print(summary)
    print(f"{'metric':<{width}}  value")
    print(f"{'-' * width}  {'-' * 12}")
    for key in sorted(metrics):
        print(f"{key:<{width}}  {metrics[key]:.6g}")
    samples = result.samples
    shown = next(
        (s for s in samples if s.status.value != "failed"), samples[0] if samples else None
    )
    if shown is not None:
        print()
        print(show_sample(shown, tokenizer))
    for sample in result.failed[:3]:
        print(f"FAILED sample {sample.index}: {sample.error}", file=sys.stderr)
    for kind, path in pictures.items():
        hint = " (open in https://ui.perfetto.dev or chrome://tracing)" if kind == "trace" else ""
        print(f"{kind}: {path}{hint}")
