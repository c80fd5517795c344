"""Transport benchmark: the same diffusion rollout over every transport, side by side, in one run.

Modes (stand-in SGLang-diffusion engines in their own processes, fixed per-step latency):

- ``json-inline``   base64/JSON decoded on the event loop: the naive path miles started from
- ``json-pool``     base64/JSON decoded in the parser pool (body read into the arena)
- ``msgpack-pool``  msgpack decoded in place in the parser pool (body read into the arena)
- ``msgpack-fetch`` msgpack, ``fetch_in_parser``: workers fetch straight into the arena
- ``msgpack-inline`` msgpack read into the arena by the main process, zero-copy decode on the loop
- ``gen-only``      tiny bodies, same latency: the lower bound of the rollout time

Per mode (a warm-up rollout, then ``--repeats`` pairs of rollouts: one with the lag ticker
and memory sampler, one bare for the CPU reading; the best time of all): ``perf/rollout_time``, its ratio to the naive mode, pipeline efficiency (lower
bound / rollout time), GB of tensors delivered, main-process CPU seconds per GB, event-loop
lag (a 1 ms ticker: p50/p99/max), peak memory (PSS) of the client processes (main + pool
workers) and of the engines, ``perf/parser_max_queue_depth``, bytes on the wire. Prints a
table and one JSON line; writes a PNG chart. Also measures the worker -> main hand-off of a
decoded body against a plain memcpy.

    python benchmarks/transport.py --quick      # under a minute
    python benchmarks/transport.py              # the default workload (a few GB a rollout)

Engines answer repeated identical requests from a body cache (``StandInConfig.
body_cache_bytes``): a warm-up rollout fills it, so their encoding CPU does not compete
with the client on this 2-core machine during the measured rollouts.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil
import torch

from miles_lite import (
    DiffusionRollout,
    DiffusionRolloutConfig,
    DiffusionSamplingParams,
    RolloutResult,
    Sample,
    run_sync,
)
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.pools.arena import ArenaConfig
from miles_lite.pools.parser_pool import ParserPoolConfig
from miles_lite.testing import EngineProcessGroup, StandInConfig

MODES: dict[str, dict[str, Any]] = {
    "json-inline": {"wire": "json", "transport": "inline", "fetch_in_parser": False},
    "json-pool": {"wire": "json", "transport": "pool", "fetch_in_parser": False},
    "msgpack-pool": {"wire": "msgpack", "transport": "pool", "fetch_in_parser": False},
    "msgpack-fetch": {"wire": "msgpack", "transport": "pool", "fetch_in_parser": True},
    "msgpack-inline": {"wire": "msgpack", "transport": "inline", "fetch_in_parser": False},
}
NAIVE = "json-inline"


@dataclass
class Workload:
    prompts: int
    samples_per_prompt: int
    microgroup_size: int
    engines: int
    engine_concurrency: int
    steps: int
    step_latency_s: float
    channels: int
    frames: int
    latent_size: int
    dtype: str
    parser_workers: int
    repeats: int
    #: Latent width when it differs from its height (``latent_size``); 0: square.
    latent_width: int = 0
    #: Pixels per latent cell: the decoded output is [3, frames, H * this, W * this].
    vae_scale_factor: int = 2
    #: Steps that carry log-probs and debug tensors (the first ones); 0: every step.
    sde_steps: int = 0

    def engine_config(self, wire: str, *, tiny: bool = False) -> StandInConfig:
        return StandInConfig(
            wire=wire,  # type: ignore[arg-type]
            latent_channels=1 if tiny else self.channels,
            latent_height=2 if tiny else self.latent_size,
            latent_width=2 if tiny else self.latent_width or self.latent_size,
            vae_scale_factor=2 if tiny else self.vae_scale_factor,
            num_frames=1 if tiny else self.frames,
            dtype=self.dtype,  # type: ignore[arg-type]
            step_latency_s=self.step_latency_s,
            max_concurrent=self.engine_concurrency,
            num_inference_steps=self.steps,
            body_cache_bytes=64 << 30,
        )

    def rollout_config(self, mode: dict[str, Any]) -> DiffusionRolloutConfig:
        return DiffusionRolloutConfig(
            n_samples_per_prompt=self.samples_per_prompt,
            microgroup_size=self.microgroup_size,
            sampling=self.sampling(),
            transport=mode["transport"],
            fetch_in_parser=mode["fetch_in_parser"],
            reward="mean",
        )

    def sampling(self) -> DiffusionSamplingParams:
        sde = list(range(min(self.sde_steps, self.steps))) if self.sde_steps else None
        return DiffusionSamplingParams(num_inference_steps=self.steps, rollout_sde_step_indices=sde)

    def sample_bytes(self) -> int:
        """Tensor bytes of one sample (msgpack form), from the stand-in's own accounting."""
        from miles_lite.testing import RolloutRequest

        config = self.engine_config("msgpack")
        payload = {**self.sampling().to_payload(), "prompt": "x", "seed": 0}
        request = RolloutRequest.parse({**payload, "num_outputs_per_prompt": 1}, config)
        return request.tensor_bytes(config)

    def rollout_bytes(self) -> int:
        """Tensor bytes of one rollout."""
        return self.sample_bytes() * self.prompts * self.samples_per_prompt

    @property
    def in_flight(self) -> int:
        """Requests the router lets the engines hold at once (see run_mode)."""
        return self.engines * 2 * self.engine_concurrency


def output_mean(samples: list[Sample]) -> list[float]:
    """The reward of the benchmark: mean of the generated output (cheap, real tensor work),
    summed in float32 a chunk at a time: ``.float().mean()`` (or ``mean(dtype=...)``)
    makes a float32 copy of the whole latent, 300 MB per reward worker for LTX's."""
    return [_mean(s.generated_output) for s in samples]  # type: ignore[arg-type]


def _mean(tensor: torch.Tensor) -> float:
    flat = tensor.reshape(-1)
    total = sum(float(chunk.sum(dtype=torch.float32)) for chunk in flat.split(1 << 20))
    return total / max(flat.numel(), 1)


@dataclass
class Measure:
    rollout_time: float = 0.0
    gb: float = 0.0
    wire_bytes: float = 0.0
    cpu_s: float = 0.0
    lags_ms: list[float] = field(default_factory=list)
    peak_client_gb: float = 0.0
    #: The client processes' PSS when the rollout started (the previous one's let go).
    start_client_gb: float = 0.0
    peak_engines_gb: float = 0.0
    parser_depth: float | None = None
    handoff_gbps: float | None = None
    failed: int = 0
    spills: float = 0.0
    pickled_bytes: float = 0.0
    gc_max_ms: float = 0.0
    #: The machine's 1-minute load average when the mode started and ended (2 cores).
    load: tuple[float, float] = (0.0, 0.0)


class MemorySampler:
    """Samples PSS of this process + pool workers, and of the engines, every 50 ms."""

    def __init__(self, engine_pids: set[int]) -> None:
        self.engine_pids = engine_pids
        self.peak_client = 0
        self.start_client: int | None = None
        self.peak_engines = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            client = engines = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    pss = proc.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if proc.pid in self.engine_pids:
                    engines += pss
                else:
                    client += pss
            if self.start_client is None:
                self.start_client = client
            self.peak_client = max(self.peak_client, client)
            self.peak_engines = max(self.peak_engines, engines)
            self._stop.wait(0.05)


def tensor_bytes(samples: list[Sample]) -> int:
    total = 0

    def walk(value: Any) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    for s in samples:
        walk([s.generated_output, s.rollout_log_probs, s.rollout_debug_tensors, s.denoising_env])
        if s.dit_trajectory is not None:
            walk([s.dit_trajectory.latents, s.dit_trajectory.timesteps, s.dit_trajectory.sigmas])
    return total


async def measured_rollout(
    rollout: DiffusionRollout, prompts: list[str], sampler_pids: set[int], *, instrumented: bool
) -> Measure:
    """One rollout. ``instrumented``: with the lag ticker and the memory sampler running;
    otherwise bare, to read the main process's CPU without their cost."""
    lags: list[float] = []

    async def ticker() -> None:
        while True:
            start = time.perf_counter()
            await anyio.sleep(0.001)
            lags.append((time.perf_counter() - start - 0.001) * 1e3)

    proc = psutil.Process()
    gc.collect()
    pauses: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            pauses.append(-time.perf_counter())
        elif pauses:
            pauses[-1] += time.perf_counter()

    gc.callbacks.append(on_gc)
    memory = MemorySampler(sampler_pids)
    cpu0 = sum(proc.cpu_times()[:2])
    if instrumented:
        with memory:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                result: RolloutResult = await rollout.run(prompts, rollout_id=0)
                tg.cancel_scope.cancel()
    else:
        result = await rollout.run(prompts, rollout_id=0)
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    gc.callbacks.remove(on_gc)
    m = Measure(
        rollout_time=result.metrics["perf/rollout_time"],
        gb=tensor_bytes(result.samples) / 1e9,
        wire_bytes=result.metrics["perf/wire_bytes"],
        cpu_s=cpu,
        lags_ms=lags,
        peak_client_gb=memory.peak_client / 1e9,
        start_client_gb=(memory.start_client or 0) / 1e9,
        peak_engines_gb=memory.peak_engines / 1e9,
        parser_depth=result.metrics.get("perf/parser_max_queue_depth"),
        failed=len(result.failed),
        spills=result.metrics.get("perf/arena_spills", 0.0),
        pickled_bytes=result.metrics.get("perf/pickled_bytes", 0.0),
        gc_max_ms=1e3 * max(pauses, default=0.0),
    )
    rates = [
        s.wire_bytes / (s.deserialize_end - s.deserialize_start) / 1e9
        for s in result.spans
        if s.deserialize_end and s.deserialize_start and s.deserialize_end > s.deserialize_start
    ]
    m.handoff_gbps = statistics.median(rates) if rates else None
    del result
    gc.collect()
    return m


async def run_mode(
    name: str, work: Workload, urls: list[str], engine_pids: set[int], arena: ArenaConfig
) -> Measure:
    mode = MODES.get(name, {"wire": "msgpack", "transport": "pool", "fetch_in_parser": False})
    prompts = [f"prompt {i}" for i in range(work.prompts)]
    client = EngineClientConfig(read_timeout_s=600, retry=RetryPolicy(max_attempts=1))
    parser = ParserPoolConfig(workers=work.parser_workers, arena=arena)
    config = dataclasses.replace(
        work.rollout_config(mode),
        # One more request queued per slot, as SGLang's scheduler would hold it: a slot
        # starts the next generation while the previous body is still on the wire.
        engines=EngineConfig(
            router=RouterConfig(max_inflight_per_engine=work.in_flight // work.engines),
            client=client,
        ),
        parser=parser,
    )
    async with DiffusionRollout.open(urls, config=config, rewards={"mean": output_mean}) as rollout:
        # Warm-up: workers, arena pages, engine body caches (the same seeds every run).
        await rollout.run(prompts, rollout_id=0)
        runs = []
        for _ in range(work.repeats):
            runs.append(await measured_rollout(rollout, prompts, engine_pids, instrumented=True))
            runs.append(await measured_rollout(rollout, prompts, engine_pids, instrumented=False))
    instrumented, bare = runs[0::2], runs[1::2]
    best = min(instrumented, key=lambda m: m.rollout_time)
    best.rollout_time = min(m.rollout_time for m in runs)
    best.cpu_s = min(m.cpu_s for m in bare)
    best.peak_client_gb = max(r.peak_client_gb for r in instrumented)
    best.start_client_gb = max(r.start_client_gb for r in instrumented)
    best.peak_engines_gb = max(r.peak_engines_gb for r in instrumented)
    # Counters, not timings: the worst rollout of the mode is what it must answer for.
    best.spills = max(m.spills for m in runs)
    best.pickled_bytes = max(m.pickled_bytes for m in runs)
    return best


def arena_config(name: str, work: Workload) -> ArenaConfig:
    """Room for a whole rollout's tensors (the benchmark keeps them, as a trainer would).

    base64/JSON bodies are a third larger than their tensors and shrink once decoded in
    place, leaving holes that later bodies do not fit: give json-pool half as much again.
    json-inline decodes out of the arena into private memory: its arena holds only the
    bodies in flight. The msgpack modes pre-fault one rollout's bodies; the headroom past
    them is faulted only if used.
    """
    total = work.rollout_bytes()
    if name == "json-inline":
        body = math.ceil(work.sample_bytes() * work.microgroup_size * 4 / 3)
        return ArenaConfig(size_bytes=int(work.in_flight * body * 1.1) + (64 << 20))
    if MODES.get(name, {}).get("wire") == "json":
        return ArenaConfig(size_bytes=int(total * 1.6) + (64 << 20))
    return ArenaConfig(size_bytes=int(total * 1.1) + (64 << 20), populate_bytes=total)


def run_with_engines(name: str, work: Workload) -> Measure:
    tiny = name == "gen-only"
    wire = "msgpack" if tiny else MODES[name]["wire"]
    configs = [work.engine_config(wire, tiny=tiny)] * work.engines
    load = os.getloadavg()[0]
    with EngineProcessGroup(configs) as group:
        pids = {p.pid for p in group.processes if p.pid is not None}
        m = run_sync(run_mode, name, work, group.urls, pids, arena_config(name, work))
    m.load = (load, os.getloadavg()[0])
    return m


async def handoff(size_bytes: int, workers: int) -> dict[str, float]:
    """Body bytes in the arena -> tensors usable in the main process, vs a warm memcpy."""
    import numpy as np

    from miles_lite.pools.parser_pool import ParserPool
    from miles_lite.testing import encode_msgpack_body

    n = size_bytes // 4 // 8
    items = [{"t": [torch.randn(n) for _ in range(8)]}]
    body = encode_msgpack_body(items)
    config = ParserPoolConfig(
        workers=workers, arena=ArenaConfig(size_bytes=2 * len(body) + (16 << 20))
    )
    async with ParserPool(config) as parser:
        times = []
        for _ in range(5):
            lease = await parser.allocate(len(body))
            lease.view[:] = body  # the body as it lands from the socket
            start = time.perf_counter()
            parsed = await parser.parse(lease, "application/msgpack")
            times.append(time.perf_counter() - start)
            del parsed, lease
            gc.collect()
    src = np.frombuffer(body, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm
    copies = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - start)
    return {
        "handoff_gbps": len(body) / min(times) / 1e9,
        "memcpy_gbps": len(body) / min(copies) / 1e9,
        "body_mb": len(body) / 1e6,
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def commit() -> str:
    """The checked-out commit (with ``+dirty`` for uncommitted changes), or ``unknown``."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def report(
    results: dict[str, Measure],
    lower: float,
    lower_load: tuple[float, float],
    hand: dict[str, float],
    work: Workload,
    out: Path,
) -> dict[str, Any]:
    naive = results[NAIVE].rollout_time if NAIVE in results else float("nan")
    rows = []
    for name, m in results.items():
        rows.append(
            {
                "mode": name,
                "rollout_time_s": m.rollout_time,
                "speedup_vs_naive": naive / m.rollout_time,
                "efficiency": lower / m.rollout_time,
                "gb_delivered": m.gb,
                "main_cpu_ms_per_gb": 1e3 * m.cpu_s / m.gb if m.gb else float("nan"),
                "loop_lag_p50_ms": percentile(m.lags_ms, 0.5),
                "loop_lag_p99_ms": percentile(m.lags_ms, 0.99),
                "loop_lag_max_ms": max(m.lags_ms, default=float("nan")),
                "peak_client_gb": m.peak_client_gb,
                "client_gb_at_start": m.start_client_gb,
                "peak_client_over_kept": m.peak_client_gb / m.gb if m.gb else float("nan"),
                "peak_engines_gb": m.peak_engines_gb,
                "parser_max_queue_depth": m.parser_depth,
                "handoff_gbps_median": m.handoff_gbps,
                "wire_gb": m.wire_bytes / 1e9,
                "failed_samples": m.failed,
                "arena_spills": m.spills,
                "pickled_bytes": m.pickled_bytes,
                "gc_max_pause_ms": m.gc_max_ms,
                "load_1m": list(m.load),
            }
        )
    cols = [
        ("mode", "{:<15}"),
        ("rollout_time_s", "{:>8.2f}"),
        ("speedup_vs_naive", "{:>7.2f}x"),
        ("efficiency", "{:>6.2f}"),
        ("gb_delivered", "{:>6.2f}"),
        ("main_cpu_ms_per_gb", "{:>9.0f}"),
        ("loop_lag_p50_ms", "{:>7.2f}"),
        ("loop_lag_p99_ms", "{:>7.2f}"),
        ("loop_lag_max_ms", "{:>8.1f}"),
        ("peak_client_gb", "{:>7.2f}"),
        ("parser_max_queue_depth", "{:>5}"),
        ("wire_gb", "{:>6.2f}"),
        ("load_1m", "{:>9}"),
    ]
    heads = [
        "mode",
        "time s",
        "vs naive",
        "effic",
        "GB",
        "CPU ms/GB",
        "lag p50",
        "lag p99",
        "lag max",
        "mem GB",
        "depth",
        "wire GB",
        "load",
    ]
    widths = [len(c[1].format(*([0] if c[0] != "mode" else [""]))) for c in cols]
    print()
    print(
        "  ".join(
            h.rjust(w) if i else h.ljust(w)
            for i, (h, w) in enumerate(zip(heads, widths, strict=True))
        )
    )
    for row in rows:
        cells = []
        for key, fmt in cols:
            value = row[key]
            if key == "parser_max_queue_depth":
                cells.append(fmt.format("-" if value is None else int(value)))
            elif key == "load_1m":
                cells.append(fmt.format("{:.1f}-{:.1f}".format(*value)))
            else:
                cells.append(fmt.format(value if value is not None else float("nan")))
        print("  ".join(cells))
    print(f"\nlower bound (gen-only, tiny bodies): {lower:.2f} s")
    print(
        f"hand-off, body in arena -> tensors in main process: {hand['handoff_gbps']:.1f} GB/s per worker "
        f"({hand['body_mb']:.0f} MB body); warm memcpy {hand['memcpy_gbps']:.1f} GB/s"
    )
    summary = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(),
        "workload": work.__dict__,
        "rollout_gb": work.rollout_bytes() / 1e9,
        "lower_bound_s": lower,
        "lower_bound_load_1m": list(lower_load),
        "handoff": hand,
        "modes": rows,
    }
    print(json.dumps(summary, default=float))
    chart(rows, lower, out)
    return summary


def chart(rows: list[dict[str, Any]], lower: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["mode"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    bars = ax1.bar(
        names,
        [r["rollout_time_s"] for r in rows],
        color=["#c44" if "json" in n else "#47a" for n in names],
    )
    ax1.axhline(lower, color="k", linestyle="--", linewidth=1, label=f"lower bound {lower:.1f} s")
    for bar, r in zip(bars, rows, strict=True):
        ax1.annotate(
            f"{r['speedup_vs_naive']:.1f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax1.set_ylabel("perf/rollout_time (s)")
    ax1.set_title("rollout time (lower is better)")
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", rotation=30, labelsize=8)
    x = range(len(rows))
    ax2.bar([i - 0.2 for i in x], [r["loop_lag_p99_ms"] for r in rows], width=0.4, label="p99")
    ax2.bar([i + 0.2 for i in x], [r["loop_lag_max_ms"] for r in rows], width=0.4, label="max")
    ax2.set_yscale("log")
    ax2.set_xticks(list(x), names, rotation=30, fontsize=8)
    ax2.set_ylabel("event-loop lag (ms, log)")
    ax2.set_title("event-loop lag (1 ms ticker)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"chart: {out}")


DEFAULT: dict[str, Any] = dict(
    prompts=12,
    samples_per_prompt=4,
    microgroup_size=2,
    engines=2,
    engine_concurrency=2,
    steps=20,
    step_latency_s=0.075,
    channels=16,
    frames=8,
    latent_size=64,
    dtype="bfloat16",
    parser_workers=2,
    # Best of four timed rollouts per mode (two pairs): on two cores shared with the
    # engines, one rollout in a few loses 0.2-0.4 s to a neighbour's burst.
    repeats=2,
    latent_width=0,
    vae_scale_factor=2,
    sde_steps=0,
)
#: The shape of miles' LTX-2.3 recipe (video GRPO, fetch_in_parser): 8 samples a prompt,
#: one output per request (multi-output video bodies pipelined worse there), 57 frames at
#: 512x768 bf16, 3 SDE steps a sample, requests that take long. A sample here holds the
#: same bytes as one of LTX-2.3's: the decoded video [3, 57, 512, 768] (134 MB, most of
#: the body) and 11 latents of 0.79 MB (10 steps; LTX-2.3's latent is [128, 8, 16, 24],
#: the stand-in's [18, 57, 16, 24]: it does not compress time, so fewer channels give
#: the same bytes), 3 of them per SDE step for debug tensors: ~150 MB a request.
#: Scaled to this shared 24 GiB machine: 2 prompts (16 requests, 2.4 GB kept; the engines
#: cache the bodies, the JSON modes need a third more) instead of the recipe's 8, and 5 s
#: a generation instead of minutes, which makes the transfer a larger share of the
#: rollout than on GPUs (a harsher test of the transport, not a kinder one).
LTX = {
    **DEFAULT,
    "prompts": 2,
    "samples_per_prompt": 8,
    "microgroup_size": 1,
    "steps": 10,
    "step_latency_s": 0.5,
    "channels": 18,
    "frames": 57,
    "latent_size": 16,
    "latent_width": 24,
    "vae_scale_factor": 32,
    "sde_steps": 3,
    "repeats": 1,  # 20 s rollouts: a neighbour's burst weighs less
}
PRESETS = {
    "default": DEFAULT,
    "quick": {
        **DEFAULT,
        "prompts": 4,
        "samples_per_prompt": 2,
        "microgroup_size": 1,
        "steps": 8,
        "step_latency_s": 0.04,
        "repeats": 1,
    },
    "ltx": LTX,
}
#: Where a preset's chart goes unless --out says: only the default run replaces the
#: chart the README shows.
CHARTS = {"default": Path("benchmarks/transport.png")}


def chart_path(preset: str, out: str | None) -> Path:
    """``out`` if given; else the README's chart for the default preset, and a file in the
    temporary directory for the others (a quick run never replaces the README's chart)."""
    if out:
        return Path(out)
    return CHARTS.get(preset) or Path(tempfile.gettempdir()) / f"miles_lite-transport-{preset}.png"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="default",
        help="the workload (default: %(default)s)",
    )
    parser.add_argument("--quick", action="store_true", help="--preset quick: under a minute")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES)
    )
    parser.add_argument(
        "--out",
        default=None,
        help="PNG chart path (default: benchmarks/transport.png for the default preset, "
        "the temporary directory for the others)",
    )
    parser.add_argument(
        "--handoff-mb", type=int, default=None, help="body size of the hand-off measure"
    )
    for key, value in DEFAULT.items():
        parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=None)
    args = parser.parse_args(argv)
    name = "quick" if args.quick else args.preset
    preset = dict(PRESETS[name])
    for key in preset:
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    work = Workload(**preset)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {list(MODES)}")
    out = chart_path(name, args.out)
    rollout_bytes = work.rollout_bytes()
    width = work.latent_width or work.latent_size
    print(
        f"workload {name}: {work.prompts} prompts x {work.samples_per_prompt} samples, "
        f"microgroups of {work.microgroup_size}, {work.engines} engines x "
        f"{work.engine_concurrency} slots, {work.steps} steps x {work.step_latency_s} s, "
        f"latents [{work.channels}, {work.frames}, {work.latent_size}, {width}] {work.dtype}: "
        f"{work.sample_bytes() / 1e6:.0f} MB a sample, {rollout_bytes / 1e9:.2f} GB of "
        f"tensors a rollout; load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    gen_only = run_with_engines("gen-only", work)
    lower = gen_only.rollout_time
    print(f"  gen-only lower bound: {lower:.2f} s", file=sys.stderr)
    results: dict[str, Measure] = {}
    for mode in modes:
        results[mode] = run_with_engines(mode, work)
        print(
            f"  {mode}: {results[mode].rollout_time:.2f} s (load {results[mode].load[1]:.1f})",
            file=sys.stderr,
        )
    hand_mb = args.handoff_mb or (64 if name == "quick" else 512)
    hand = run_sync(handoff, hand_mb << 20, work.parser_workers)
    report(results, lower, gen_only.load, hand, work, out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
