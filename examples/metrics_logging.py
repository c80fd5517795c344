"""Log every rollout's metrics: to TensorBoard, or to any logger that takes a dict.

python examples/metrics_logging.py --logdir runs/demo     # then: tensorboard --logdir runs

``result.metrics`` is a flat ``{name: float}`` dict (names in the README's metrics table),
so any dict logger takes it as it is: ``wandb.log(result.metrics, step=step)``,
``mlflow.log_metrics(result.metrics, step=step)``, or TensorBoard's ``add_scalar`` per name
as below (``pip install tensorboard``). Three text rollouts run on an in-process stand-in
engine, a JSON line per rollout goes to stdout as well.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from miles_lite import PromptGroup, TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.rewards import math_reward
from miles_lite.testing import (
    TextPolicy,
    TextRule,
    TextStandInConfig,
    TextStandInEngine,
    load_qwen3_tokenizer,
)

#: Logs one rollout's metrics at a step.
MetricsLogger = Callable[[dict[str, float], int], None]

POLICY = TextPolicy(
    rules=[TextRule(r"2 \+ 3", "It is \\boxed{5}.", alternatives=("It is \\boxed{6}.",))]
)


def tensorboard_logger(logdir: Path) -> tuple[MetricsLogger, Callable[[], None]]:
    """A logger writing each metric as a TensorBoard scalar, and its close."""
    from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

    writer = SummaryWriter(log_dir=str(logdir))

    def log(metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            writer.add_scalar(name, value, global_step=step)
        writer.flush()

    return log, writer.close


def print_logger(metrics: dict[str, float], step: int) -> None:
    """Any dict logger works the same way; this one prints a JSON line."""
    print(json.dumps({"step": step, **metrics}, sort_keys=True))


async def main(loggers: list[MetricsLogger], rollouts: int) -> None:
    tokenizer = load_qwen3_tokenizer()
    config = TextRolloutConfig(
        n_samples_per_prompt=4, sampling=TextSamplingParams(max_new_tokens=16), reward="math"
    )
    prompts = [PromptGroup(prompt="What is 2 + 3?", label="5")] * 4
    async with (
        TextStandInEngine(TextStandInConfig(policy=POLICY), tokenizer) as engine,
        TextRollout.open(
            [engine.url], tokenizer=tokenizer, config=config, rewards={"math": math_reward}
        ) as rollout,
    ):
        for step in range(rollouts):
            result = await rollout.run(prompts)
            for log in loggers:
                log(result.metrics, step)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", type=Path, default=None, help="TensorBoard log folder")
    parser.add_argument("--rollouts", type=int, default=3)
    args = parser.parse_args()
    loggers: list[MetricsLogger] = [print_logger]
    close: Callable[[], None] = lambda: None  # noqa: E731
    if args.logdir is not None:
        board, close = tensorboard_logger(args.logdir)
        loggers.append(board)
    try:
        run_sync(main, loggers, args.rollouts)
    finally:
        close()
