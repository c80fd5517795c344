"""``miles-lite diffusion`` (alias ``rollout``): flags -> a diffusion rollout against
running SGLang-diffusion engines; the demo's diffusion half runs the same code on
stand-ins."""

from __future__ import annotations

import argparse
import functools
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from miles_lite.cli.config_flags import DIFFUSION_FIELDS, apply_flags, given
from miles_lite.cli.paths import CliError, load_function, one_line_errors
from miles_lite.cli.preflight import check_engine_urls, check_outputs
from miles_lite.cli.report import report, say_startup_steps, write_pictures
from miles_lite.diffusion.config import DiffusionRolloutConfig
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.result import RolloutResult

__all__ = ["DEMO_PROMPTS", "build_config", "build_reward", "check_reward", "rollout", "run"]

DEMO_PROMPTS = [
    "a red fox in fresh snow",
    "a lighthouse at dusk",
    "a bowl of ramen, studio light",
    "an astronaut riding a horse",
    "a watercolor of a harbor town",
    "a macro photo of a dragonfly",
    "a neon street in the rain",
    "a cat sleeping on a keyboard",
]


def build_config(args: argparse.Namespace, *, frames: int | None = None) -> DiffusionRolloutConfig:
    """The rollout's config: :class:`DiffusionRolloutConfig`'s defaults with the flags the
    user gave (:data:`~miles_lite.cli.config_flags.DIFFUSION_FIELDS`; ``frames``: the
    demo's video frames, when ``--num-frames`` is not given); :class:`CliError` naming a
    flag whose value the config refuses. No I/O."""
    reward = None if args.reward == "none" and not args.reward_function_path else "score"
    config = DiffusionRolloutConfig(reward=reward)
    if frames is not None:
        config = replace(config, sampling=replace(config.sampling, num_frames=frames))
    return apply_flags(config, given(args, DIFFUSION_FIELDS))


def build_reward(args: argparse.Namespace, tmp: Path, *, demo: bool) -> dict[str, Any]:
    """The reward pool's function under the config's kind (``"score"``), if any.

    ``clip`` against real engines needs ``--clip-model`` (a random CLIP scores noise);
    the demo uses a tiny random one, written into ``tmp``."""
    if args.reward_function_path:
        return {"score": load_function(args.reward_function_path)}
    if args.reward == "none":
        return {}
    if args.reward == "mean":
        from miles_lite.rewards.functions import latent_mean_reward

        return {"score": latent_mean_reward}
    check_reward(args, demo=demo)
    from miles_lite.rewards.clip_reward import ClipReward

    if args.clip_model:
        return {"score": ClipReward(model_path=args.clip_model, tokenizer=args.clip_tokenizer)}
    from miles_lite.rewards.tiny_clip import tiny_clip

    config, tokenizer_dir = tiny_clip(tmp)
    return {"score": ClipReward(config=config, tokenizer=tokenizer_dir)}


def check_reward(args: argparse.Namespace, *, demo: bool) -> None:
    """``--reward clip`` against real engines names a ``--clip-model`` (no I/O)."""
    if args.reward == "clip" and not args.clip_model and not args.reward_function_path and not demo:
        raise CliError(
            "--reward clip against real engines needs --clip-model (a PickScore/CLIP"
            " checkpoint folder): a randomly initialised CLIP scores noise; or use"
            " --reward mean, --reward none, or --reward-function-path"
        )


async def rollout(
    urls: Sequence[str],
    prompts: Sequence[str],
    *,
    config: DiffusionRolloutConfig,
    rewards: Mapping[str, Any],
    generate: GenerateFn | None,
    options: Mapping[str, Any],
    progress: bool,
) -> RolloutResult:
    """Open a diffusion rollout on ``urls`` and run ``prompts`` once."""
    from miles_lite.diffusion.rollout import DiffusionRollout

    async with DiffusionRollout.open(
        urls,
        config=config,
        rewards=rewards,
        generate=generate,
        generate_options=options,
        progress=progress,
    ) as opened:
        return await opened.run(list(prompts))


def run_on(
    urls: Sequence[str],
    args: argparse.Namespace,
    *,
    prompts: Sequence[str],
    generate: GenerateFn | None,
    options: Mapping[str, Any],
    demo: bool,
    frames: int | None = None,
) -> RolloutResult:
    """Build everything from ``args`` and run one rollout on ``urls`` (blocking)."""
    from miles_lite._core.run_sync import run_sync

    config = build_config(args, frames=frames)
    with tempfile.TemporaryDirectory(prefix="miles-lite-") as tmp:
        job = functools.partial(
            rollout,
            list(urls),
            prompts,
            config=config,
            rewards=build_reward(args, Path(tmp), demo=demo),
            generate=generate,
            options=options,
            progress=not args.no_progress,
        )
        return run_sync(job, use_uvloop=args.uvloop)


def run(args: argparse.Namespace, *, generate: GenerateFn | None, options: dict[str, Any]) -> int:
    """``miles-lite diffusion``: one rollout against ``--engine-url`` engines."""
    say_startup_steps()
    prompts = args.prompt or DEMO_PROMPTS[:4]
    with one_line_errors():
        # Everything that needs no I/O first: the URLs, every flag's value, the outputs.
        check_engine_urls(args.engine_url)
        build_config(args)
        check_reward(args, demo=False)
        check_outputs(output=None, trace=args.trace, timeline=args.timeline)
        result = run_on(
            args.engine_url, args, prompts=prompts, generate=generate, options=options, demo=False
        )
        pictures = write_pictures(result, args.trace, args.timeline)
    report("diffusion", result, as_json=args.json, pictures=pictures)
    return 1 if result.failed else 0
