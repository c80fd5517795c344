"""A trainer that is SIGKILLed over and over, for the journal's crash test.

The GRPO example's loop, in small (a stand-in engine with a scripted policy, a trainer
state of 16 floats): groups streamed from a journaled rollout, a training batch per step,
the trainer's checkpoint, ``commit``, a weight update. Each life resumes from the journal
(the groups handed after the last commit first, then the groups never handed, then the
prompts never given) and from the checkpoint of the last committed step.

``python crash_trainer.py --journal run.db --workdir DIR --kills 24 --seed 7``: a parent
that imports everything once, then forks a life at a time, kills it (SIGKILL) when it
reaches a phase picked at random (seeded) among generate / handed / train / commit /
update, plus a random delay, and at the end lets one life finish. Each life appends one
line per step to ``DIR/steps.jsonl`` (the digest of the batch it trained) before its
commit. Prints one JSON line: the kills and the phase of each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import anyio
import anyio.to_thread
import torch

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.testing import (
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    load_qwen3_tokenizer,
)
from miles_lite.training import batch_digest, training_batch
from miles_lite.types import Sample

PHASES = ("generate", "handed", "train", "commit", "update")
GROUPS_PER_STEP = 2
SAMPLES = 2
TOKENS = 48
#: Prompts ending in 0 or 5 get a long answer (truncated at TOKENS): still generating
#: when the short ones of their call are kept, so they are aborted with partial output.
LONG = TextRule(pattern=r"round \d*[05]:", token_ids=list(range(1000, 1100)))


class EvenTokens:
    """The GRPO example's toy reward: the share of even ids in the response."""

    async def score(self, samples: list[Sample]) -> list[float]:
        out = []
        for s in samples:
            response = s.tokens[len(s.tokens) - s.response_length :]
            out.append(sum(t % 2 == 0 for t in response) / max(1, len(response)))
        return out


def config() -> TextRolloutConfig:
    return TextRolloutConfig(
        n_samples_per_prompt=SAMPLES,
        sampling=TextSamplingParams(max_new_tokens=TOKENS),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=16)),
        reward="even",
        # Each stream call stops early once 2 steps' groups are kept: the groups still
        # generating are aborted and carried to the next call (partial rollout).
        rollout_batch_size=2 * GROUPS_PER_STEP,
        over_sampling_batch_size=3 * GROUPS_PER_STEP,
    )


def train_step(weights: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """A stand-in for the optimizer step (the trainer's time, off the loop)."""
    time.sleep(0.01)
    return weights + 0.01 * advantages.sum() * torch.arange(weights.numel())


class Life:
    """One life of the trainer (see the module docstring); ``say`` tells the parent its
    phase."""

    def __init__(self, journal: Path, workdir: Path, prompts: int, say: Any) -> None:
        self.journal, self.workdir, self.prompts, self.say = journal, workdir, prompts, say
        self.step = 0
        self.weights = torch.zeros(16, dtype=torch.float64)

    def checkpoint(self, step: int) -> Path:
        return self.workdir / f"ckpt_{step}.pt"

    async def run(self, tokenizer: Any) -> None:
        engine_config = TextStandInConfig(
            token_latency_s=0.002, policy=TextPolicy(rules=(LONG,), default_length=16)
        )
        async with (
            TextStandInEngine(engine_config, tokenizer) as engine,
            TextRollout.open(
                [engine.url],
                tokenizer=tokenizer,
                config=config(),
                rewards={"even": EvenTokens()},
                journal=self.journal,
            ) as rollout,
        ):
            state = await rollout.resume()
            if state.step is not None:
                self.step = state.step
                self.weights = torch.load(self.checkpoint(self.step))
            await rollout.update_weights(None, version=self.step)
            self.say("ready")
            batch: list[list[Sample]] = []
            for group in state.handed:  # handed before the crash: trained on first
                batch.append(group)
                if len(batch) == GROUPS_PER_STEP:
                    await self.train(rollout, batch)
                    batch = []
            fresh = [
                PromptGroup(prompt=f"Write some numbers, round {i}:", metadata={"prompt_id": i})
                for i in range(self.prompts)
                if str(i) not in state.given
            ]
            carry: list[Any] = list(state.pending)
            while carry or fresh:
                chunk = carry + fresh[: 3 * GROUPS_PER_STEP]
                fresh = fresh[3 * GROUPS_PER_STEP :]
                async with rollout.stream(chunk, max_ahead=3 * GROUPS_PER_STEP) as groups:
                    self.say("generate")
                    async for group in groups:
                        self.say("handed")
                        batch.append(group)
                        if len(batch) == GROUPS_PER_STEP:
                            await self.train(rollout, batch)
                            batch = []
                        self.say("generate")
                carry = groups.result.partial
            if batch:
                await self.train(rollout, batch)
        self.say("done")

    async def train(self, rollout: TextRollout, groups: list[list[Sample]]) -> None:
        self.say("train")
        data = training_batch(groups)
        step = self.step + 1
        self.weights = await anyio.to_thread.run_sync(train_step, self.weights, data.advantages)
        tmp = self.checkpoint(step).with_suffix(".tmp")
        torch.save(self.weights, tmp)
        os.replace(tmp, self.checkpoint(step))  # the trainer's own checkpoint, then commit
        record = {
            "step": step,
            "digest": batch_digest(data),
            "prompts": [g[0].metadata["prompt_id"] for g in groups],
            "pid": os.getpid(),
        }
        async with await anyio.open_file(self.workdir / "steps.jsonl", "a") as log:
            await log.write(json.dumps(record) + "\n")
        self.say("commit")
        await rollout.commit(step, batch=data)
        self.step = step
        self.say("update")
        await rollout.update_weights(None, version=step)


def live(args: argparse.Namespace, tokenizer: Any, write_fd: int) -> None:
    """A child's life: runs the trainer, telling the parent each phase."""

    def say(phase: str) -> None:
        os.write(write_fd, (phase + "\n").encode())

    life = Life(Path(args.journal), Path(args.workdir), args.prompts, say)
    anyio.run(life.run, tokenizer)


def campaign(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = load_qwen3_tokenizer()
    rng = random.Random(args.seed)
    kills: list[dict[str, Any]] = []
    lives = 0
    while True:
        last = len(kills) >= args.kills
        target = rng.choice(PHASES)
        nth = rng.randint(1, 3)
        delay = rng.uniform(0.0, 0.05 if target == "generate" else 0.004)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one life, then out without running the parent's exits
            os.close(read_fd)
            code = 0
            try:
                live(args, tokenizer, write_fd)
            except BaseException as exc:  # reported to the parent, which fails
                os.write(write_fd, f"error {exc!r}\n".encode())
                code = 1
            os._exit(code)
        lives += 1
        os.close(write_fd)
        seen: dict[str, int] = {}
        buffer = b""
        killed = None
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                data = pipe.read(4096)
                if not data:
                    break
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    phase = line.decode()
                    if phase.startswith("error"):
                        raise SystemExit(f"a life failed: {phase}")
                    seen[phase] = seen.get(phase, 0) + 1
                    if not last and killed is None and phase == target and seen[phase] >= nth:
                        time.sleep(delay)
                        os.kill(pid, signal.SIGKILL)
                        killed = {"phase": target, "nth": nth, "delay_s": round(delay, 4)}
                if killed is not None:
                    break
        _, status = os.waitpid(pid, 0)
        if killed is not None:
            kills.append(killed)
            continue
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and "done" in seen:
            return {"kills": kills, "lives": lives}
        if not (os.WIFSIGNALED(status) or last):
            raise SystemExit(f"a life ended with status {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--journal", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(campaign(args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
