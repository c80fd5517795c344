"""The ``miles-lite`` command line: every command and flag, with the standard library only
(so ``miles-lite --help`` answers at once; the commands import the library when run)."""

from __future__ import annotations

import argparse

__all__ = ["build_parser"]

DESCRIPTION = """\
miles_lite: the rollout layer of RL post-training, without Ray.

  miles-lite demo                    text and diffusion rollouts on stand-in engines
  miles-lite demo --agent            one kind: --text, --tools, --agent, --diffusion (--all)
  miles-lite text --engine-url URL --tokenizer DIR --prompt-data prompts.jsonl --output out.jsonl
  miles-lite diffusion --engine-url URL --prompt "a cat"
  miles-lite serve text --port 30000 a stand-in engine to point the commands at
"""


def _run_flags(parser: argparse.ArgumentParser, *, samples: int | None) -> None:
    """Flags every rollout command has."""
    g = parser.add_argument_group("rollout")
    g.add_argument(
        "--n-samples-per-prompt",
        "--samples-per-prompt",
        dest="samples_per_prompt",
        type=int,
        default=samples,
        help="samples per prompt (a group)",
    )
    g.add_argument(
        "--rollout-batch-size",
        type=int,
        default=None,
        help="groups to keep; the rollout stops once that many passed the filters",
    )
    g.add_argument(
        "--over-sampling-batch-size",
        type=int,
        default=None,
        help="groups started at a time while more are needed (default: --rollout-batch-size)",
    )
    g.add_argument("--seed", type=int, default=0, help="base seed of the samples' seeds")
    g.add_argument("--reward-workers", type=int, default=1, help="processes of each reward pool")
    g.add_argument(
        "--custom-generate-function-path",
        default=None,
        metavar="MODULE.FN",
        help="a generate function; its add_arguments(parser) flags reach it as input.options",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="write the rollout as a Chrome/Perfetto trace (JSON) here",
    )
    out.add_argument(
        "--timeline",
        default=None,
        metavar="PATH",
        help="draw the rollout's timeline as a PNG here (needs matplotlib)",
    )
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON line per rollout"
    )
    out.add_argument("--uvloop", action="store_true", help="run the event loop on uvloop")


def _engine_flags(parser: argparse.ArgumentParser, *, inflight: int) -> None:
    g = parser.add_argument_group("engines")
    g.add_argument(
        "--engine-url",
        action="append",
        required=True,
        metavar="URL",
        help="an engine, http://host:port (repeat for several)",
    )
    g.add_argument(
        "--max-inflight-per-engine",
        "--sglang-server-concurrency",
        dest="max_inflight_per_engine",
        type=int,
        default=inflight,
        help=f"requests each engine takes at once (default {inflight})",
    )
    g.add_argument(
        "--wait-for-engines",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the engines to answer /health (600 for engines"
        " still loading weights)",
    )


def _text_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("text")
    g.add_argument(
        "--max-new-tokens",
        "--rollout-max-response-len",
        dest="max_new_tokens",
        type=int,
        default=1024,
        help="output tokens per sample at most",
    )
    g.add_argument(
        "--temperature",
        "--rollout-temperature",
        dest="temperature",
        type=float,
        default=1.0,
        help="sampling temperature",
    )
    g.add_argument(
        "--top-p",
        "--rollout-top-p",
        dest="top_p",
        type=float,
        default=1.0,
        help="nucleus sampling: the smallest set of tokens holding this probability",
    )
    g.add_argument(
        "--max-context-len",
        "--rollout-max-context-len",
        dest="max_context_len",
        type=int,
        default=None,
        help="the engines' context (prompt + output); longer prompts are never sent",
    )
    g.add_argument(
        "--reward",
        "--rm-type",
        dest="reward",
        choices=["math", "deepscaler", "dapo", "f1", "none"],
        default="math",
        help="rule-based reward of the samples against their label (default math)",
    )
    g.add_argument(
        "--reward-function-path",
        default=None,
        metavar="MODULE.FN",
        help="your reward: (samples) -> list of floats, run in the reward pool",
    )
    g.add_argument(
        "--dynamic-filter",
        action="append",
        choices=["drop_zero_std", "drop_failed", "drop_aborted"],
        default=None,
        help="drop finished groups (repeatable): drop_zero_std keeps groups whose rewards differ",
    )
    g.add_argument(
        "--dynamic-sampling-filter-path",
        default=None,
        metavar="MODULE.FN",
        help="your filter: (group) -> bool or FilterResult",
    )
    gen = parser.add_argument_group("generate functions")
    gen.add_argument(
        "--generate",
        choices=["single-turn", "multi-turn", "benchmark"],
        default="single-turn",
        help="single-turn /generate, multi-turn tool calling, or random output lengths",
    )
    gen.add_argument("--generate-max-turns", type=int, default=16, help="multi-turn: turns")
    gen.add_argument(
        "--generate-tool-specs-path",
        default=None,
        metavar="MODULE.NAME",
        help="multi-turn: OpenAI tool specs (a list, or a function returning one)",
    )
    gen.add_argument(
        "--generate-execute-tool-function-path",
        default=None,
        metavar="MODULE.FN",
        help="multi-turn: async (name, arguments) -> str",
    )
    gen.add_argument(
        "--generate-tool-call-parser", default="qwen", help="multi-turn: qwen, qwen25 or hermes"
    )
    gen.add_argument(
        "--generate-tool-timeout-s", type=float, default=30.0, help="multi-turn: bound per tool"
    )
    gen.add_argument("--benchmark-min-new-tokens", type=int, default=1, help="benchmark")
    gen.add_argument(
        "--benchmark-max-new-tokens",
        type=int,
        default=None,
        help="benchmark (default --max-new-tokens)",
    )
    gen.add_argument(
        "--custom-agent-function-path",
        default=None,
        metavar="MODULE.FN",
        help="an agent: async (base_url, messages, request_kwargs); it chats through a session URL",
    )


def _diffusion_flags(parser: argparse.ArgumentParser, *, demo: bool) -> None:
    g = parser.add_argument_group("diffusion")
    g.add_argument("--microgroup-size", type=int, default=2, help="samples per request")
    g.add_argument("--steps", type=int, default=8, help="num_inference_steps")
    g.add_argument(
        "--transport",
        choices=["pool", "inline"],
        default="pool",
        help="decode bodies in the parser pool, or on the event loop",
    )
    g.add_argument("--fetch-in-parser", action="store_true", help="parser workers fetch the bodies")
    g.add_argument("--parser-workers", type=int, default=2, help="parser pool processes")
    g.add_argument("--arena-mb", type=int, default=256, help="shared-memory arena (MiB)")
    g.add_argument(
        "--reward",
        choices=["clip", "mean", "none"],
        default="clip" if demo else "none",
        help="clip: a PickScore-style CLIP reward (a tiny random CLIP in the demo;"
        " give --clip-model for real engines); mean: the output's mean value",
    )
    g.add_argument("--clip-model", default=None, metavar="DIR", help="a CLIP/PickScore checkpoint")
    g.add_argument(
        "--clip-tokenizer", default=None, metavar="DIR", help="its tokenizer (default --clip-model)"
    )
    g.add_argument(
        "--reward-function-path",
        default=None,
        metavar="MODULE.FN",
        help="your reward: (samples) -> list of floats",
    )


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``miles-lite`` parser and each command's parser by name."""
    parser = argparse.ArgumentParser(
        prog="miles-lite",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="rollouts of every kind on stand-in engines: no GPU, no server",
        description="Rollouts on stand-in SGLang engines started on loopback. With no kind"
        " flag: a text rollout (math reward, dynamic sampling) and a diffusion rollout.",
    )
    kinds = demo.add_argument_group("kinds (default: --text --diffusion)")
    kinds.add_argument("--text", action="store_true", help="/generate, math reward, early stop")
    kinds.add_argument("--tools", action="store_true", help="multi-turn tool calling")
    kinds.add_argument("--agent", action="store_true", help="an openai agent through sessions")
    kinds.add_argument("--diffusion", action="store_true", help="diffusion: parser and CLIP pools")
    kinds.add_argument("--all", action="store_true", help="every kind")
    demo.add_argument(
        "--prompts", type=int, default=None, help="prompts per rollout (default: per kind)"
    )
    demo.add_argument(
        "--out-dir",
        default=None,
        metavar="DIR",
        help="where traces and timelines go (default: a miles-lite-demo folder in the temp dir)",
    )
    _run_flags(demo, samples=None)
    e = demo.add_argument_group("stand-in engines")
    e.add_argument("--engines", type=int, default=2, help="diffusion stand-ins")
    e.add_argument("--latent-size", type=int, default=32, help="latent height and width")
    e.add_argument("--channels", type=int, default=4, help="latent channels")
    e.add_argument("--frames", type=int, default=1, help=">1 gives video-shaped 5-D latents")
    e.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="bfloat16",
        help="latents' dtype",
    )
    e.add_argument("--step-latency", type=float, default=0.02, help="seconds per denoising step")
    e.add_argument("--engine-concurrency", type=int, default=4, help="requests generating at once")
    e.add_argument(
        "--wire",
        choices=["msgpack", "json"],
        default="msgpack",
        help="msgpack: SGLang >= 0.5.19; json: base64 tensors of <= 0.5.15",
    )
    e.add_argument(
        "--token-latency",
        type=float,
        default=0.004,
        help="text stand-in: seconds per output token",
    )
    _diffusion_flags(demo, demo=True)

    text = sub.add_parser(
        "text",
        help="a text rollout against running SGLang engines; samples out as JSONL",
        description="A text rollout (/generate single or multi turn, or an agent) against"
        " running engines. Prompts: a JSONL file, one object per line with the prompt (a"
        " string or a chat messages list) under --input-key and the label under --label-key.",
    )
    _engine_flags(text, inflight=256)
    t = text.add_argument_group("data")
    t.add_argument(
        "--tokenizer",
        "--hf-checkpoint",
        dest="tokenizer",
        required=True,
        metavar="DIR",
        help="the model's tokenizer (a folder or a hub id transformers can load)",
    )
    t.add_argument("--prompt-data", required=True, metavar="FILE", help="prompts, JSONL")
    t.add_argument("--input-key", default="prompt", help="the prompt's key in each line")
    t.add_argument("--label-key", default="label", help="the label's key in each line")
    t.add_argument("--output", default=None, metavar="FILE", help="write the samples here as JSONL")
    _run_flags(text, samples=4)
    _text_flags(text)

    diffusion = sub.add_parser(
        "diffusion",
        aliases=["rollout"],
        help="a diffusion rollout against running SGLang-diffusion engines",
    )
    _engine_flags(diffusion, inflight=4)
    d = diffusion.add_argument_group("data")
    d.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    d.add_argument("--width", type=int, default=None, help="image width (the model's default)")
    d.add_argument("--height", type=int, default=None, help="image height (the model's default)")
    d.add_argument("--num-frames", type=int, default=None, help="video frames (video models)")
    _run_flags(diffusion, samples=4)
    _diffusion_flags(diffusion, demo=False)

    serve = sub.add_parser(
        "serve",
        help="serve a stand-in engine (text or diffusion) on a port, to try the commands",
        description="Serves a stand-in SGLang engine on loopback until Ctrl-C. The text one"
        " answers arithmetic prompts (\\boxed{} answers, an add tool) with the real Qwen3"
        " tokenizer; the diffusion one answers /rollout/generate with synthetic latents.",
    )
    serve.add_argument("kind", choices=["text", "diffusion"])
    serve.add_argument("--port", type=int, default=30000, help="0: any free port")
    serve.add_argument("--token-latency", type=float, default=0.004, help="text: s per token")
    serve.add_argument("--step-latency", type=float, default=0.02, help="diffusion: s per step")
    return parser, {"demo": demo, "text": text, "diffusion": diffusion, "rollout": diffusion}
