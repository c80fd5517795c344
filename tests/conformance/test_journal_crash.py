"""The journal's crash test against the real SGLang server, with streamed tokens
(``JournalConfig(stream_tokens_every=8)``): a rollout of 4 samples is SIGKILLed 3 times
mid-generation and resumed each time on the same journal; each in-flight sample resumes
from its last recorded token (its final tokens extend every journaled prefix), the tokens
lost at each kill are counted, and every resumed sample's log-probs match the served
weights (re-scored by the same model in torch, 1e-4, as test_training re-scores)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from miles_lite.testing import SGLangServerConfig

HERE = Path(__file__).resolve().parent
KILLS = 3
TOKENS = 96  # journal_crash_child.TOKENS
EVERY = 8  # journal_crash_child.EVERY
LOGPROB_TOLERANCE = 1e-4


def life(url: str, journal: Path, out: Path, kill_after: int) -> tuple[int, dict[str, Any]]:
    command = [
        sys.executable,
        str(HERE / "journal_crash_child.py"),
        *("--url", url, "--journal", str(journal), "--out", str(out)),
        *("--kill-after", str(kill_after)),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert out.exists(), run.stderr[-3000:]
    return run.returncode, json.loads(out.read_text())


def logprobs(model: Any, tokens: list[int], response_length: int) -> list[float]:
    prompt = len(tokens) - response_length
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
        all_lp = torch.log_softmax(logits, dim=-1)
    return [float(all_lp[prompt - 1 + i, t]) for i, t in enumerate(tokens[prompt:])]


def test_a_streamed_rollout_killed_3_times_resumes_from_its_last_recorded_tokens(
    sglang_url: str, tmp_path: Path
) -> None:
    journal = tmp_path / "run.db"
    lives = []
    for n in range(KILLS):
        code, report = life(sglang_url, journal, tmp_path / f"life{n}.json", kill_after=8)
        assert code == -9, report  # SIGKILLed mid-generation
        lives.append(report)
    code, last = life(sglang_url, journal, tmp_path / "last.json", kill_after=0)
    assert code == 0
    lives.append(last)

    # At each kill: the output each sample had offered to the journal, and what the next
    # life resumed from: all of it, but records the kill caught queued.
    lost = []
    for before, after in itertools.pairwise(lives):
        assert after["kept"], "nothing resumed from streamed records"
        # What each sample had at the kill: offered this life, else what it resumed from.
        had = {**before["kept"], **before["offered"]}
        for k, n in after["kept"].items():
            # SGLang's first chunk holds 1 token, then every 8: records at 9, 17, ...
            assert EVERY <= n <= had[k]
        offered = sum(had.values())
        lost.append(offered - sum(after["kept"].values()))
        assert 0 <= lost[-1] < offered  # some of what was received is always kept
    print(f"tokens received and lost at each of {KILLS} kills: {lost}")
    print(f"tokens kept at each resume: {[sum(x['kept'].values()) for x in lives[1:]]}")

    done = last["done"]
    assert len(done) == 4
    resumed = {k for x in lives[1:] for k in x["kept"]}
    assert resumed  # samples that went on from a record
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(SGLangServerConfig().model)).train(False)
    worst = 0.0
    for k in sorted(resumed):
        sample = done[k]
        assert sample["status"] == "truncated" and sample["response_length"] == TOKENS
        for x in lives[1:]:  # extends every prefix it was resumed from
            prefix = x["prefixes"].get(k)
            if prefix is not None:
                assert sample["tokens"][: len(prefix)] == prefix
        # One version for all (no update here): its spans cover the output.
        assert sample["spans"][-1][2] == TOKENS
        expected = logprobs(model, sample["tokens"], TOKENS)
        worst = max(
            worst, *(abs(a - b) for a, b in zip(sample["log_probs"], expected, strict=True))
        )
    print(f"resumed samples' log-probs against the served weights: max |delta| {worst:.2e}")
    assert worst < LOGPROB_TOLERANCE, worst
