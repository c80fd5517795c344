"""A journaled rollout that SIGKILLs itself mid-generation, or resumes one, for the
streamed-token test (``test_stream_kill.py``).

``python stream_kill_child.py crash --journal run.db --every 8 --kill-at 96``: a stand-in
engine and a text rollout of 2 prompts x 2 samples (each truncated at TOKENS), journaled
(``JournalConfig(stream_tokens_every=8)``; ``--every 0``: off); once the engine made
``--kill-at`` output tokens in all (and, streaming, 8 progress records were queued), it
prints them (one JSON line) and SIGKILLs itself.

``python stream_kill_child.py resume --journal run.db``: resumes the same journal on a new
stand-in and prints one JSON line: the output tokens each pending sample had from the
journal (``kept``), the tokens the engine made to finish them (``generated``), and the
samples' tokens (``tokens``) and journaled prefixes (``prefixes``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import anyio

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import (
    TextPolicy,
    TextStandInConfig,
    TextStandInEngine,
    load_qwen3_tokenizer,
)
from miles_lite.training import Journal, JournalConfig
from miles_lite.types import Sample

TOKENS = 64


class Length:
    async def score(self, samples: list[Sample]) -> list[float]:
        return [float(s.response_length) for s in samples]


def config() -> TextRolloutConfig:
    return TextRolloutConfig(
        n_samples_per_prompt=2,
        sampling=TextSamplingParams(max_new_tokens=TOKENS),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=16)),
        reward="length",
    )


async def main(args: argparse.Namespace, tokenizer: Any) -> None:
    # The stand-in would answer 4 x TOKENS: every sample is truncated at TOKENS.
    engine_config = TextStandInConfig(
        token_latency_s=0.004, policy=TextPolicy(default_length=4 * TOKENS)
    )
    every = args.every or None
    async with (
        Journal(args.journal, JournalConfig(stream_tokens_every=every)) as journal,
        TextStandInEngine(engine_config, tokenizer) as engine,
        TextRollout.open(
            [engine.url],
            tokenizer=tokenizer,
            config=config(),
            rewards={"length": Length()},
            journal=journal,
        ) as rollout,
    ):
        if args.mode == "crash":
            prompts = [
                PromptGroup(prompt=f"Write some numbers, round {i}:", metadata={"prompt_id": i})
                for i in range(2)
            ]
            async with anyio.create_task_group() as tg:
                tg.start_soon(rollout.run, prompts)
                # Streamed: also once the client got 2 chunks of 8 a sample (8 records
                # queued), whatever the load on the machine.
                while (  # noqa: ASYNC110
                    engine.statistics().generated_tokens < args.kill_at
                    or (every is not None and journal.progress_written < 8)
                ):
                    await anyio.sleep(0.001)
                made = engine.statistics().generated_tokens
                print(json.dumps({"made": made, "progress": journal.progress_written}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        state = await rollout.resume()
        pending = [s for g in state.pending for s in g]
        kept = [s.response_length for s in pending]
        prefixes = [list(s.tokens) for s in pending]
        result = await rollout.run(state.pending)
        done = {s.index: s for g in result.groups for s in g}
        report = {
            "kept": kept,
            "generated": engine.statistics().generated_tokens,
            "prefixes": prefixes,
            "tokens": [list(done[s.index].tokens) for s in pending],
            "lengths": [done[s.index].response_length for s in pending],
            "log_probs": [len(done[s.index].rollout_log_probs) for s in pending],
        }
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("crash", "resume"))
    parser.add_argument("--journal", required=True)
    parser.add_argument("--every", type=int, default=0)
    parser.add_argument("--kill-at", type=int, default=96)
    arguments = parser.parse_args()
    anyio.run(main, arguments, load_qwen3_tokenizer())
    sys.exit(0)
