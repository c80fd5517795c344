"""One life of a journaled rollout on the real SGLang server, for the conformance crash
test (``test_journal_crash.py``): ``python journal_crash_child.py --url URL --journal
run.db --out life.json --kill-after K``.

It resumes the journal (the first life starts 2 prompts x 2 samples of TOKENS tokens,
``ignore_eos``), with ``JournalConfig(stream_tokens_every=EVERY)``, and writes to
``--out`` what it resumed from (each in-flight sample's journaled output: ``kept``,
``prefixes``). With ``--kill-after K`` it SIGKILLs itself once K more progress records were
queued this life, after adding to ``--out`` the output each sample had last offered to the
journal (``offered``); with 0 it finishes the run and adds the samples (``done``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import anyio

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import load_qwen3_tokenizer
from miles_lite.training import Journal, JournalConfig
from miles_lite.types import Sample

TOKENS = 96
EVERY = 8


class Offered(Journal):
    """A journal that remembers the output each sample last offered as progress."""

    offered: dict[str, int]

    def progress(self, gid: int, slot: int, attempt: int, sample: Sample) -> bool:
        self.offered[key(sample)] = sample.response_length
        return super().progress(gid, slot, attempt, sample)


def key(sample: Sample) -> str:
    return f"{sample.metadata['prompt_id']}/{sample.index % 2}"


async def main(args: argparse.Namespace, tokenizer: Any) -> None:
    report: dict[str, Any] = {}
    out = anyio.Path(args.out)
    config = TextRolloutConfig(
        n_samples_per_prompt=2,
        sampling=TextSamplingParams(max_new_tokens=TOKENS, extra={"ignore_eos": True}),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=8)),
    )
    journal = Offered(args.journal, JournalConfig(stream_tokens_every=EVERY))
    journal.offered = {}
    async with (
        journal,
        TextRollout.open(
            [args.url], tokenizer=tokenizer, config=config, journal=journal
        ) as rollout,
    ):
        state = await rollout.resume()
        if state.given:
            groups: list[Any] = list(state.pending)
        else:
            groups = [
                PromptGroup(prompt=f"Count slowly to {i}00:", metadata={"prompt_id": i})
                for i in range(2)
            ]
        resumed = [s for g in state.pending for s in g if s.response_length > 0]
        report["kept"] = {key(s): s.response_length for s in resumed}
        report["prefixes"] = {key(s): list(s.tokens) for s in resumed}
        if args.kill_after:
            async with anyio.create_task_group() as tg:
                tg.start_soon(rollout.run, groups)
                while journal.progress_written < args.kill_after:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
                report["offered"] = dict(journal.offered)
                await out.write_text(json.dumps(report))
                os.kill(os.getpid(), signal.SIGKILL)
        result = await rollout.run(groups)
        report["done"] = {
            key(s): {
                "tokens": list(s.tokens),
                "response_length": s.response_length,
                "log_probs": list(s.rollout_log_probs or []),
                "spans": [[w.version, w.start, w.end] for w in s.weight_spans],
                "status": s.status.value,
            }
            for g in result.groups
            for s in g
        }
        await out.write_text(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kill-after", type=int, default=0)
    arguments = parser.parse_args()
    anyio.run(main, arguments, load_qwen3_tokenizer())
