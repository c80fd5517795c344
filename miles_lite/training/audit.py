"""Audit: the journaled tokens re-scored on a live engine, so a user sees whether the engine
still gives the log-probs that were trained on.

Each handed sample's tokens go to ``/generate`` with ``max_new_tokens`` 0,
``return_logprob`` and ``logprob_start_len`` at the response's start; the engine's log-prob
of each response token (``input_token_logprobs``) is compared with the journaled
``rollout_log_probs`` where the loss mask is 1, and ``|delta|`` is reported per weight
version (the version of the span that made the token).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import anyio.to_thread

from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.errors import EngineProtocolError
from miles_lite.training.reader import iter_handed, open_reader
from miles_lite.types import Sample, SampleStatus

__all__ = ["VersionAudit", "audit_journal", "score_sample"]


@dataclass(frozen=True, kw_only=True)
class VersionAudit:
    """``|delta log-prob|`` over the ``tokens`` one weight ``version`` made: ``max`` and
    ``mean``, and the ``samples`` they came from."""

    version: str
    tokens: int
    samples: int
    max: float
    mean: float


def _handed_samples(path: str | os.PathLike[str], limit: int | None) -> list[Sample]:
    conn = open_reader(path)
    try:
        out: list[Sample] = []
        for _, _, _, group in iter_handed(conn):
            out += [s for s in group if s.status is not SampleStatus.FAILED]
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out
    finally:
        conn.close()


async def score_sample(client: EngineClient, url: str, sample: Sample) -> list[float]:
    """The engine's log-prob of each response token of ``sample`` (re-scored, nothing
    generated). Raises the client's errors, and ``EngineProtocolError`` for an answer
    without them."""
    prompt = len(sample.tokens) - sample.response_length
    answer = await client.post_json(
        url,
        "/generate",
        {
            "input_ids": sample.tokens,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": prompt,
        },
    )
    entries = (answer or {}).get("meta_info", {}).get("input_token_logprobs")
    if not isinstance(entries, list) or len(entries) < sample.response_length:
        raise EngineProtocolError(
            f"/generate at {url} gave no input_token_logprobs for the"
            f" {sample.response_length} response tokens of sample {sample.index}",
            url=url,
        )
    tail = entries[len(entries) - sample.response_length :]
    return [math.nan if e[0] is None else float(e[0]) for e in tail]


def _deltas(sample: Sample, scored: list[float]) -> Iterable[tuple[str, float]]:
    journaled = sample.rollout_log_probs
    if not isinstance(journaled, list):
        return
    mask = sample.loss_mask or [1] * sample.response_length
    for span in sample.weight_spans:
        for i in range(span.start, span.end):
            if mask[i] and not math.isnan(scored[i]):
                yield span.version, abs(scored[i] - journaled[i])


async def audit_journal(
    path: str | os.PathLike[str],
    url: str,
    *,
    limit: int | None = None,
    config: EngineClientConfig | None = None,
) -> list[VersionAudit]:
    """Re-score the handed samples of the journal at ``path`` (the first ``limit``) on the
    engine at ``url``; ``|delta log-prob|`` per weight version, versions in order of first
    appearance. Raises :class:`~miles_lite.errors.JournalError` for a journal that cannot
    be read and the engine client's errors."""
    samples = await anyio.to_thread.run_sync(_handed_samples, path, limit)
    found: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    async with EngineClient(config or EngineClientConfig()) as client:
        for sample in samples:
            scored = await score_sample(client, url, sample)
            versions = set()
            for version, delta in _deltas(sample, scored):
                found.setdefault(version, []).append(delta)
                versions.add(version)
            for version in versions:
                counts[version] = counts.get(version, 0) + 1
    return [
        VersionAudit(
            version=v,
            tokens=len(d),
            samples=counts[v],
            max=max(d),
            mean=math.fsum(d) / len(d),
        )
        for v, d in found.items()
    ]
