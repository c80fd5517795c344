"""A GRPO loop on CPU, end to end: groups streamed from SGLang, a GRPO step in torch on the
same tiny model, save_pretrained, update_weights, and the next groups carry the new version.

python examples/grpo_loop.py --stand-in --steps 4            # an in-process stand-in engine
python examples/grpo_loop.py --url http://127.0.0.1:30000    # a real SGLang server serving
    --model ~/.cache/miles-lite/sglang-venv/tiny-qwen2       # this model (the default)

The model is a tiny random-weight Qwen2 (hidden size 32, 2 layers, the real Qwen3
tokenizer); the reward is the fraction of even token ids a sample generates, which a
random model scores near 0.5, so GRPO has signal from the first step. Only the token
embeddings train (they are also the output layer: the model ties them), with Adam at lr
0.1. The reward climbs to 1.0 within 10-15 steps: the policy collapses onto a few even
ids, which is fine for showing that the loop learns, and nothing more.

Generation runs one step ahead of training (``max_ahead``: one step's groups): while the
trainer trains on step k's groups, step k+1's generate with the weights of before the
update, so a step trains on groups one version behind (version lag 1; ``max_staleness=1``
keeps anything older out, and none comes). Each step also measures the train/inference
mismatch: the trainer's log-probs of the sampled tokens, computed with the very weights
that made them, against the engine's ``rollout_log_probs``.

Prints one JSON line per step, then a summary line; ``--png`` draws reward and version lag
per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import torch

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine import EngineConfig, RouterConfig
from miles_lite.rollout.groups import PromptGroup
from miles_lite.training import ResumeState, TrainingBatch, group_lag, training_batch
from miles_lite.training.stream import GroupStream
from miles_lite.types import Sample

SERVED_MODEL = Path("~/.cache/miles-lite/sglang-venv/tiny-qwen2").expanduser()


def tiny_qwen2(vocab_size: int, seed: int = 0) -> Any:
    """The tiny Qwen2 the conformance server serves (scripts/sglang-cpu/build_model.py),
    built from its config with random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


class EvenTokens:
    """The toy reward: the fraction of a sample's generated ids that are even (an async
    scorer, run on the loop: it is a few additions)."""

    async def score(self, samples: list[Sample]) -> list[float]:
        rewards = []
        for sample in samples:
            out = sample.tokens[len(sample.tokens) - sample.response_length :]
            rewards.append(sum(t % 2 == 0 for t in out) / max(len(out), 1))
        return rewards


def response_logprobs(model: Any, batch: TrainingBatch, where: torch.Tensor) -> torch.Tensor:
    """The model's log-prob of each token ``where`` marks (a [B, T] mask over
    ``batch.tokens``; never the first token), computing the output layer only there."""
    hidden = model.model(input_ids=batch.tokens, attention_mask=batch.attention_mask)
    picked = hidden.last_hidden_state[:, :-1][where[:, 1:]]
    logits = model.lm_head(picked).float()
    targets = batch.tokens[:, 1:][where[:, 1:]]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def grpo_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    by_version: dict[str, tuple[Any, torch.Tensor]],
) -> dict[str, float]:
    """One GRPO step: a policy gradient with group-normalized advantages over the response
    tokens, each token weighted by its truncated importance ratio (``min(ratio, 2)``,
    detached: TIS, as verl and slime offer) against the engine's ``rollout_log_probs``,
    which corrects for tokens made by the previous weights. (A PPO-style clip of the
    ratio would zero the gradient here: with Adam at lr 0.1 one step moves a token's
    log-prob by several nats, and every token of a step made one version behind stays
    flat.)

    ``by_version`` maps each version in the batch to (the model with its weights, the
    tokens it made on its own KV): before the update, each model's log-probs of its tokens
    are compared with the engine's (the train/inference mismatch).
    """
    model.train()
    mask = batch.loss_masks > 0
    logp = response_logprobs(model, batch, mask)
    rollout = batch.rollout_log_probs[mask]
    advantages = batch.advantages[mask]
    weight = torch.exp(logp.detach() - rollout).clamp(max=2.0)
    loss = -(weight * logp * advantages).mean()
    diffs = []
    with torch.no_grad():
        for weights, made in by_version.values():
            if made.any():
                theirs = response_logprobs(weights, batch, made)
                diffs.append((theirs - batch.rollout_log_probs[made]).abs())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    diff = torch.cat(diffs) if diffs else torch.zeros(0)
    return {
        "loss": float(loss.detach()),
        "mismatch_max": float(diff.max()) if diff.numel() else math.nan,
        "mismatch_mean": float(diff.mean()) if diff.numel() else math.nan,
        "mismatch_tokens": float(diff.numel()),
    }


def made_by(groups: list[list[Sample]], batch: TrainingBatch, version: str) -> torch.Tensor:
    """A [B, T] mask of the tokens ``version`` made on its own KV (laid out as ``batch``)."""
    mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
    samples = [s for g in groups for s in g if s.status.value != "failed"]
    for row, sample in enumerate(samples):
        prompt = len(sample.tokens) - sample.response_length
        for span in sample.weight_spans:
            if span.version == version and span.kv_version is None:
                mask[row, prompt + span.start : prompt + span.end] = True
    return mask


def checkpoint_path(journal: Path, step: int) -> Path:
    """The trainer's own checkpoint of ``step``, beside the journal."""
    return journal.with_name(f"{journal.name}.step{step}.pt")


async def commit(
    rollout: TextRollout,
    model: Any,
    optimizer: torch.optim.Optimizer,
    journal: Path,
    step: int,
    data: TrainingBatch,
) -> None:
    """The trainer's checkpoint of ``step`` (model and optimizer), then the journal's
    commit: the groups handed so far are consumed, and ``data`` replays bit for bit."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    await anyio.to_thread.run_sync(torch.save, state, checkpoint_path(journal, step))
    await rollout.commit(step, batch=data)


async def resume(
    rollout: TextRollout, model: Any, optimizer: torch.optim.Optimizer, journal: Path
) -> ResumeState:
    """Where the journal stands; the model and optimizer back at its last committed step."""
    state: ResumeState = await rollout.resume()
    if state.step is not None:
        saved = await anyio.to_thread.run_sync(torch.load, checkpoint_path(journal, state.step))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    return state


class HandedFirst:
    """The groups handed before a crash and not committed (trained on first, as they
    were), then the stream's."""

    def __init__(self, state: ResumeState | None, groups: GroupStream) -> None:
        self.handed = [] if state is None else list(state.handed)
        self.groups = groups

    def __aiter__(self) -> HandedFirst:
        return self

    async def __anext__(self) -> list[Sample]:
        if self.handed:
            return self.handed.pop(0)
        return await self.groups.__anext__()


def save(model: Any, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    return folder


async def train(
    urls: list[str],
    tokenizer: Any,
    model: Any,
    *,
    steps: int,
    groups_per_step: int = 2,
    samples_per_group: int = 4,
    tokens: int = 16,
    lr: float = 0.1,
    workdir: Path,
    journal: Path | None = None,
) -> list[dict[str, float]]:
    """Run the loop for ``steps`` steps; one record per step. With ``journal``, a restart
    on the same file goes on from the last committed step (see :func:`commit`)."""
    for name, param in model.named_parameters():
        param.requires_grad_(name == "model.embed_tokens.weight")
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    config = TextRolloutConfig(
        n_samples_per_prompt=samples_per_group,
        sampling=TextSamplingParams(max_new_tokens=tokens, extra={"ignore_eos": True}),
        engines=EngineConfig(router=RouterConfig(max_inflight_per_engine=16)),
        reward="even",
        max_staleness=1,
    )
    prompts = [f"Write some numbers, round {i}:" for i in range((steps + 4) * groups_per_step)]
    records: list[dict[str, float]] = []
    async with TextRollout.open(
        urls, tokenizer=tokenizer, config=config, rewards={"even": EvenTokens()}, journal=journal
    ) as rollout:
        state = None if journal is None else await resume(rollout, model, optimizer, journal)
        if state is not None:
            prompts = state.pending + [
                PromptGroup(p, metadata={"prompt_id": i})
                for i, p in enumerate(prompts)
                if str(i) not in state.given
            ]
        # ---- the trainer's loop: the example's core --------------------------------------
        version = 0 if state is None else state.step or 0
        await rollout.update_weights(save(model, workdir / f"v{version}"), version=version)
        weights = {str(version): model}  # each version in flight, and a model with its weights
        batch: list[list[Sample]] = []
        lags: list[int] = []
        waited = time.monotonic()
        async with rollout.stream(prompts, max_ahead=groups_per_step) as groups:
            async for group in HandedFirst(state, groups):
                batch.append(group)
                lags.append(group_lag(group, rollout.router.versions) or 0)
                if len(batch) < groups_per_step:
                    continue
                generate_s = time.monotonic() - waited
                data = training_batch(batch)
                by_version = {v: (m, made_by(batch, data, v)) for v, m in weights.items()}
                t0 = time.monotonic()
                frozen = await anyio.to_thread.run_sync(copy.deepcopy, model)  # W_version
                stats = await anyio.to_thread.run_sync(
                    grpo_step, model, optimizer, data, by_version
                )
                t1 = time.monotonic()
                weights = {str(version): frozen, str(version + 1): model}
                version += 1
                folder = await anyio.to_thread.run_sync(save, model, workdir / f"v{version}")
                if journal is not None:
                    await commit(rollout, model, optimizer, journal, version, data)
                t2 = time.monotonic()
                report = await rollout.update_weights(folder, version=version)
                # ---------------------------------------------------------------------------
                records.append(
                    {
                        "step": float(version),
                        "reward": float(data.raw_reward.mean()),
                        "lag_mean": sum(lags) / len(lags),
                        "lag_max": float(max(lags)),
                        **stats,
                        "generate_wait_s": generate_s,
                        "train_s": t1 - t0,
                        "save_s": t2 - t1,
                        "update_s": report.elapsed_s,
                        "paused_s": report.paused_s,
                        "dropped_stale": float(groups.statistics().dropped_stale),
                    }
                )
                print(json.dumps({k: round(v, 6) for k, v in records[-1].items()}), flush=True)
                batch, lags = [], []
                waited = time.monotonic()
                if version == steps:
                    break
    return records


def plot(records: list[dict[str, float]], path: Path) -> None:
    """Reward and version lag per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, reward_axis = plt.subplots(figsize=(7, 3.5))
    reward_axis.plot(steps, [r["reward"] for r in records], "o-", color="tab:blue")
    reward_axis.set_xlabel("step")
    reward_axis.set_ylabel("reward (fraction of even ids)", color="tab:blue")
    reward_axis.set_ylim(0, 1.05)
    lag_axis = reward_axis.twinx()
    lag_axis.step(steps, [r["lag_mean"] for r in records], where="mid", color="tab:orange")
    lag_axis.set_ylabel("version lag (mean per step)", color="tab:orange")
    lag_axis.set_ylim(-0.05, 2.05)
    fig.suptitle("GRPO on CPU through miles_lite: reward and version lag")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@asynccontextmanager
async def stand_in(tokenizer: Any) -> AsyncIterator[list[str]]:
    """An in-process stand-in serving a tiny model of the same architecture."""
    from miles_lite.testing import TextStandInConfig, TextStandInEngine, TinyModelPolicy

    config = TextStandInConfig(policy=TinyModelPolicy(seed=1), max_running=16)
    async with TextStandInEngine(config, tokenizer) as engine:
        yield [engine.url]


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    if args.stand_in:
        from miles_lite.testing import load_qwen3_tokenizer

        tokenizer = load_qwen3_tokenizer()
        model = tiny_qwen2(len(tokenizer), seed=args.seed)
        engines = stand_in(tokenizer)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = Qwen2ForCausalLM.from_pretrained(args.model)
        engines = _urls([args.url])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grpo-") as workdir:
        async with engines as urls:
            records = await train(
                urls,
                tokenizer,
                model,
                steps=args.steps,
                groups_per_step=args.groups,
                samples_per_group=args.samples,
                tokens=args.tokens,
                lr=args.lr,
                workdir=Path(workdir),
                journal=args.journal,
            )
    elapsed = time.monotonic() - started
    mismatch = [r["mismatch_max"] for r in records if not math.isnan(r["mismatch_max"])]
    summary = {
        "steps": len(records),
        "minutes": round(elapsed / 60, 3),
        "reward_first": records[0]["reward"],
        "reward_last": records[-1]["reward"],
        "reward_max": max(r["reward"] for r in records),
        "first_step_above_0.7": next((r["step"] for r in records if r["reward"] > 0.7), None),
        "lag_max": max(r["lag_max"] for r in records),
        "dropped_stale": records[-1]["dropped_stale"],
        "mismatch_max": max(mismatch) if mismatch else None,
        "step_s_mean": elapsed / len(records),
        "update_s_mean": sum(r["update_s"] for r in records) / len(records),
        "train_s_mean": sum(r["train_s"] for r in records) / len(records),
    }
    print(json.dumps({"summary": summary}), flush=True)
    if args.png:
        plot(records, Path(args.png))


@asynccontextmanager
async def _urls(urls: list[str]) -> AsyncIterator[list[str]]:
    yield urls


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running SGLang server serving --model")
    where.add_argument("--stand-in", action="store_true", help="an in-process stand-in engine")
    parser.add_argument("--model", type=Path, default=SERVED_MODEL)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--groups", type=int, default=2, help="groups per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per group")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per sample")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png", help="write reward and version lag per step here")
    parser.add_argument(
        "--journal",
        type=Path,
        help="journal the run here (SQLite): run again on the same file after a crash and"
        " it goes on from the last committed step, with the groups it had",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    run_sync(main, parse())
