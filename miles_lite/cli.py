"""``miles-lite``: the command-line front end (the only place argparse and dotted paths live).

- ``miles-lite demo``: starts stand-in SGLang-diffusion engines on loopback (their own
  processes), runs a diffusion rollout on the msgpack path with a parser pool and a reward
  pool, shows a progress bar and prints the metrics.
- ``miles-lite rollout --engine-url URL ...``: the same against real engines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miles_lite._core.run_sync import run_sync
from miles_lite.diffusion.config import DiffusionRolloutConfig, DiffusionSamplingParams
from miles_lite.diffusion.rollout import DiffusionRollout
from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineConfig, RouterConfig
from miles_lite.errors import ConfigError, EngineUnavailableError
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPoolConfig
from miles_lite.rollout.result import RolloutResult

__all__ = ["main"]

#: How long ``miles-lite rollout`` waits for each engine's /health before giving up (s).
_HEALTH_TIMEOUT_S = 5.0

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


def _common(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("rollout")
    g.add_argument("--prompts", type=int, default=4, help="number of prompts (demo prompts cycle)")
    g.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    g.add_argument("--samples-per-prompt", type=int, default=4)
    g.add_argument("--microgroup-size", type=int, default=2)
    g.add_argument("--max-inflight-per-engine", type=int, default=4)
    g.add_argument(
        "--rollout-batch-size", type=int, default=None, help="groups to keep (default: all)"
    )
    g.add_argument(
        "--over-sampling-batch-size", type=int, default=None, help="groups started at a time"
    )
    g.add_argument("--steps", type=int, default=8, help="num_inference_steps")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--transport", choices=["pool", "inline"], default="pool")
    g.add_argument("--fetch-in-parser", action="store_true", help="parser workers fetch the bodies")
    g.add_argument("--parser-workers", type=int, default=2, help="--rollout-parser-num-workers")
    g.add_argument("--arena-mb", type=int, default=1024, help="shared-memory arena size (MiB)")
    g.add_argument(
        "--reward",
        choices=["clip", "mean", "none"],
        default="clip",
        help="clip: a PickScore-style CLIP reward (tiny random CLIP unless --clip-model)",
    )
    g.add_argument("--clip-model", default=None, help="a CLIP/PickScore checkpoint folder")
    g.add_argument(
        "--clip-tokenizer", default=None, help="tokenizer folder (default: --clip-model)"
    )
    g.add_argument("--reward-function-path", default=None, help="module.fn: a custom reward")
    g.add_argument("--reward-workers", type=int, default=1)
    g.add_argument("--custom-generate-function-path", default=None, help="module.fn")
    g.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("--json", action="store_true", help="print the metrics as one JSON line")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``miles-lite`` argument parser and its subcommands' parsers by name."""
    parser = argparse.ArgumentParser(prog="miles-lite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="a diffusion rollout on stand-in engines (no GPU, no server)"
    )
    _common(demo)
    e = demo.add_argument_group("stand-in engines")
    e.add_argument("--engines", type=int, default=2)
    e.add_argument("--latent-size", type=int, default=32, help="latent height and width")
    e.add_argument("--channels", type=int, default=4)
    e.add_argument("--frames", type=int, default=1, help=">1 gives video-shaped 5-D latents")
    e.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    e.add_argument("--step-latency", type=float, default=0.02, help="seconds per denoising step")
    e.add_argument("--engine-concurrency", type=int, default=4, help="requests generating at once")
    e.add_argument(
        "--wire",
        choices=["msgpack", "json"],
        default="msgpack",
        help="msgpack: SGLang >= 0.5.19; json: base64 tensors of <= 0.5.15",
    )
    roll = sub.add_parser("rollout", help="a diffusion rollout against running SGLang engines")
    roll.add_argument("--engine-url", action="append", required=True, help="repeatable")
    roll.add_argument("--width", type=int, default=None)
    roll.add_argument("--height", type=int, default=None)
    roll.add_argument("--num-frames", type=int, default=None)
    _common(roll)
    return parser, {"demo": demo, "rollout": roll}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``miles-lite``; returns the exit status."""
    parser, commands = build_parser()
    args, _ = parser.parse_known_args(argv)
    generate = None
    options: dict[str, Any] = {}
    if args.custom_generate_function_path:
        try:
            generate = load_function(args.custom_generate_function_path)
        except ConfigError as exc:
            parser.error(str(exc))
        options = _function_flags(generate, commands[args.command])
    args = parser.parse_args(argv)
    # The values of the generate function's own flags reach it as ``input.options``.
    options = {dest: getattr(args, dest) for dest in options}
    try:
        if args.command == "demo":
            result = _demo(args, generate, options)
        else:
            if args.reward == "clip" and not args.clip_model and not args.reward_function_path:
                raise ConfigError(
                    "--reward clip against real engines needs --clip-model (a PickScore/CLIP"
                    " checkpoint folder): a randomly initialised CLIP scores noise;"
                    " or pick --reward mean / none, or --reward-function-path"
                )
            result = run_sync(
                _rollout, list(args.engine_url), args, generate, options, use_uvloop=args.uvloop
            )
    except ConfigError as exc:
        parser.error(str(exc))
    except EngineUnavailableError as exc:
        print(f"miles-lite: {exc}", file=sys.stderr)
        return 2
    _report(result, args)
    return 1 if result.failed else 0


def load_object(path: str) -> Any:
    """Import ``package.module.name``; ``ConfigError`` naming the path when it does not
    resolve. The only place dotted paths are read."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"path {path!r} must be 'module.name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {path!r}: {exc}") from exc


def load_function(path: str) -> Any:
    """:func:`load_object` for a callable."""
    fn = load_object(path)
    if not callable(fn):
        raise ConfigError(f"{path!r} is not callable")
    return fn


def _function_flags(fn: Any, parser: argparse.ArgumentParser) -> dict[str, None]:
    """Let ``fn.add_arguments(parser)`` register its flags; return their destinations."""
    add_arguments = getattr(fn, "add_arguments", None)
    if add_arguments is None:
        return {}
    before = {action.dest for action in parser._actions}
    add_arguments(parser)
    return {action.dest: None for action in parser._actions if action.dest not in before}


def _demo(args: argparse.Namespace, generate: Any, options: dict[str, Any]) -> RolloutResult:
    from miles_lite.testing import EngineProcessGroup, StandInConfig

    engine = StandInConfig(
        wire=args.wire,
        latent_channels=args.channels,
        latent_height=args.latent_size,
        latent_width=args.latent_size,
        num_frames=args.frames,
        dtype=args.dtype,
        step_latency_s=args.step_latency,
        max_concurrent=args.engine_concurrency,
    )
    print(f"starting {args.engines} stand-in engine(s) on loopback ...", file=sys.stderr)
    with EngineProcessGroup([engine] * args.engines) as group:
        return run_sync(_rollout, group.urls, args, generate, options, use_uvloop=args.uvloop)


async def _rollout(
    urls: list[str], args: argparse.Namespace, generate: Any, options: dict[str, Any]
) -> RolloutResult:
    sampling = DiffusionSamplingParams(
        num_inference_steps=args.steps,
        width=getattr(args, "width", None),
        height=getattr(args, "height", None),
        num_frames=getattr(args, "num_frames", None)
        or (args.frames if getattr(args, "frames", 1) > 1 else None),
    )
    reward_kind = None if args.reward == "none" and not args.reward_function_path else "score"
    parser_config = ParserPoolConfig(
        workers=args.parser_workers, arena=ArenaConfig(size_bytes=args.arena_mb << 20)
    )
    config = DiffusionRolloutConfig(
        n_samples_per_prompt=args.samples_per_prompt,
        microgroup_size=args.microgroup_size,
        seed=args.seed,
        rollout_batch_size=args.rollout_batch_size,
        over_sampling_batch_size=args.over_sampling_batch_size,
        sampling=sampling,
        transport=args.transport,
        fetch_in_parser=args.fetch_in_parser,
        reward=reward_kind,
        reward_workers=args.reward_workers,
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=args.max_inflight_per_engine)
        ),
        parser=parser_config,
    )
    prompts = args.prompt or [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="miles-lite-") as tmp:
        rewards = {"score": _reward_fn(args, Path(tmp))} if reward_kind else {}
        async with DiffusionRollout.open(
            urls,
            config=config,
            rewards=rewards,
            generate=generate,
            generate_options=options,
            progress=not args.no_progress,
        ) as rollout:
            await _check_reachable(rollout.context.router.client, urls)
            return await rollout.run(prompts)


async def _check_reachable(client: EngineClient, urls: list[str]) -> None:
    """Fail at once, in one line, when no engine answers its /health."""
    ok = [await client.health(url, timeout_s=_HEALTH_TIMEOUT_S) for url in urls]
    if not any(ok):
        raise EngineUnavailableError(
            f"no engine answers /health within {_HEALTH_TIMEOUT_S} s: {', '.join(urls)};"
            " check that the servers are running and the URLs are right"
        )


def _reward_fn(args: argparse.Namespace, tmp: Path) -> Any:
    if args.reward_function_path:
        return load_function(args.reward_function_path)
    if args.reward == "mean":
        from miles_lite.rewards.functions import latent_mean_reward

        return latent_mean_reward
    from miles_lite.rewards.clip_reward import ClipReward
    from miles_lite.rewards.tiny_clip import tiny_clip

    if args.clip_model:
        return ClipReward(model_path=args.clip_model, tokenizer=args.clip_tokenizer)
    config, tokenizer_dir = tiny_clip(tmp)
    return ClipReward(config=config, tokenizer=tokenizer_dir)


def _report(result: RolloutResult, args: argparse.Namespace) -> None:
    metrics = dict(result.metrics)
    rewards = [s.reward for s in result.samples if isinstance(s.reward, float)]
    if rewards:
        metrics["rollout/reward_mean"] = sum(rewards) / len(rewards)
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
        return
    width = max(len(k) for k in metrics)
    print(f"\n{'metric':<{width}}  value")
    print(f"{'-' * width}  {'-' * 12}")
    for key in sorted(metrics):
        print(f"{key:<{width}}  {metrics[key]:.6g}")
    first = result.samples[0] if result.samples else None
    if (
        first is not None
        and first.dit_trajectory is not None
        and first.dit_trajectory.latents is not None
    ):
        latents = first.dit_trajectory.latents
        print(
            f"\nsample 0: seed {first.seed}, latents {list(latents.shape)} {latents.dtype}, reward {first.reward}"
        )
    for sample in result.failed[:5]:
        print(f"FAILED sample {sample.index}: {sample.error}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
