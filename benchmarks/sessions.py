"""The session server under load: four figures, each next to its baseline in one run.

    python benchmarks/sessions.py            # the default sizes (a few minutes)
    python benchmarks/sessions.py --quick    # small sizes, the smoke test's run
    python benchmarks/sessions.py --help     # every size and count is a flag
    python benchmarks/sessions.py --figures memory,degenerate   # some of the figures

1. ``agents``: N agents x K turns with the ``openai`` client through the session server,
   and the same agents with the same client straight to the engine's
   ``/v1/chat/completions`` in the same run: per-turn latency p50 / p99 and their ratios,
   over an instant engine and over one holding each turn ``tokens x --token-latency-ms``.
   Every turn must be recorded once: ``recorded == N*K``, ``token_in_turns == N*(K-1)``,
   ``templated_turns == N``, the records returned by ``close_session`` number N*K, and
   the merged samples have no TITO mismatch.
2. ``memory``: one session of ``--session-turns`` turns: the ids its records hold
   (``prompt_ids`` + ``output_ids``) against the trajectory's length, and against the
   full prompts (rebuilt with ``assembly.full_prompts``) a per-turn full-prompt record
   would hold; bytes as ``sys.getsizeof`` of the lists (their pointer arrays) and as
   tracemalloc's count for a fresh copy (pickle round trip: the lists plus one int object
   per id, as decoded from the engine's JSON).
3. ``abandoned``: ``--abandoned`` sessions opened and never closed (half of them after
   one turn) under ``idle_ttl_s=--ttl``: traced memory (tracemalloc current) and RSS
   before, with them held, and after the idle sweep; ``expired`` must equal the count
   and ``open_sessions`` end at 0.
4. ``degenerate``: a multi-turn ``/generate`` rollout (``MultiTurn``) whose model writes
   ``<tool_call> {`` over and over (~``--degenerate-tokens`` tokens, never closed; and the
   same closed once at the end), next to a plain output of the same length: the tool-call
   parse's CPU time (this thread's) and the event loop's worst tick (1 ms ticker) during
   the parse and over the whole rollout, in the loop thread's CPU time and in wall time
   (a tick waiting for a core another process holds is late in wall time only).

Engines: the text benchmark's mock (``text_mock.py``, chat) and the text stand-in
(``TextEngineProcess``, ``/generate`` with a scripted rule), each in its own process on
127.0.0.1. Prints a table and one JSON line, and writes the JSON to ``--out``. Timings
depend on the machine (its load is in the output); the counters do not.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_agents import chat_client
from text_layer import chat_turns, engines
from text_mock import MockProcess

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.agentic.assembly import assemble_samples, full_prompts
from miles_lite.agentic.config import SessionServerConfig, SessionServerStatistics
from miles_lite.agentic.server import SessionServer
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.testing import TextEngineProcess, TextPolicy, TextRule, TextStandInConfig
from miles_lite.text.context import TextContext
from miles_lite.text.multi_turn import MultiTurn, MultiTurnOptions
from miles_lite.text.tool_calls import ToolCall, ToolCallError, parse_qwen_tool_calls
from miles_lite.types import Sample

ROOT = Path(__file__).resolve().parents[1]
#: The degenerate turn's unit: <tool_call> is one special token, " {" one more.
DEGENERATE_UNIT = "<tool_call> {"


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb() -> float:
    rss: int = psutil.Process().memory_info().rss
    return rss / 2**20


def traced_mb() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 2**20


@dataclass
class Served:
    """A session server over one engine, and what its agents left behind."""

    server: SessionServer
    run: RunContext = field(default_factory=lambda: RunContext(0))
    ids: dict[str, str] = field(default_factory=dict)  # api key -> session id
    records: list[list[TurnRecord]] = field(default_factory=list)

    async def open_one(self) -> tuple[str, str]:
        session = await self.server.open_session(self.run)
        self.ids[session.api_key] = session.id
        return session.base_url, session.api_key

    async def close_one(self, key: str) -> None:
        self.records.append(await self.server.close_session(self.ids.pop(key)))


@asynccontextmanager
async def serve(
    url: str, tokenizer: Any, inflight: int, tokens: int, **config: Any
) -> AsyncIterator[Served]:
    """Engine client, router and a session server over ``url`` (``config``:
    SessionServerConfig fields), served in this process (``processes=0``) unless
    ``config`` says otherwise: the figures count this process's CPU and memory."""
    settings = engines(inflight)
    async with (
        EngineClient(settings.client) as client,
        Router([url], client, settings.router) as router,
    ):
        context = TextContext(
            tokenizer, router, TextSamplingParams(max_new_tokens=tokens), vocab_size=len(tokenizer)
        )
        server_config = SessionServerConfig(**{"processes": 0, **config})
        async with SessionServer(context, server_config) as server:
            yield Served(server)


def expect(name: str, got: object, want: object) -> None:
    """The benchmark's own counter checks: a lost or doubled turn fails the run."""
    if got != want:
        raise AssertionError(f"{name}: got {got!r}, expected {want!r}")


# -- 1. agents through the server vs straight to the engine -------------------------------


async def agents(
    url: str,
    tokenizer: Any,
    n: int,
    turns: int,
    tokens: int,
    client: str,
    label: str,
    rounds: int = 1,
) -> dict[str, Any]:
    """``rounds`` of the same load straight to the engine and through a session server,
    in alternating order (the machine's load drifts); latencies pooled over the rounds,
    every round's counters checked."""

    async def direct() -> tuple[str, str]:
        return f"{url}/v1", "none"

    async def nothing(key: str) -> None:
        return None

    lat: dict[str, list[float]] = {"server": [], "direct": []}
    cpu_s = {"server": 0.0, "direct": 0.0}
    seconds = {"server": 0.0, "direct": 0.0}
    counters: dict[str, int] = {}
    returned = mismatches = 0
    for round_ in range(rounds):
        for path in ("direct", "server") if round_ % 2 == 0 else ("server", "direct"):
            if path == "direct":
                m = await chat_turns(direct, nothing, client, n, turns, tokens, path, lat[path])
            else:
                async with serve(url, tokenizer, n, tokens) as served:
                    m = await chat_turns(
                        served.open_one, served.close_one, client, n, turns, tokens, path, lat[path]
                    )
                    stats = served.server.statistics()
                counters = _counters(stats)
                returned, mismatches = check_agents(served, stats, n, turns)
            cpu_s[path] += m.cpu_s
            seconds[path] += m.seconds
    row: dict[str, Any] = {"agents": n, "turns": turns, "client": client, "rounds": rounds}
    for path, values in lat.items():
        row[f"{path}_p50_ms"] = 1000 * quantile(values, 0.5)
        row[f"{path}_p99_ms"] = 1000 * quantile(values, 0.99)
    row["added_p50_ms"] = row["server_p50_ms"] - row["direct_p50_ms"]
    row["p50_ratio"] = row["server_p50_ms"] / row["direct_p50_ms"]
    row["p99_ratio"] = row["server_p99_ms"] / row["direct_p99_ms"]
    row["turns_per_s"] = {p: n * turns * rounds / seconds[p] for p in seconds}
    row["cpu_ms_per_turn"] = {p: 1000 * cpu_s[p] / (n * turns * rounds) for p in cpu_s}
    row["counters"] = counters  # every round's are checked: these are the last round's
    row["records_returned"] = returned
    row["tito_mismatches"] = mismatches
    return row


def check_agents(
    served: Served, stats: SessionServerStatistics, n: int, turns: int
) -> tuple[int, int]:
    """Every turn recorded once, token in after each agent's first: the records returned
    and the TITO mismatches of the merged samples."""
    records = [r for session in served.records for r in session]
    mismatches = sum(assemble_samples(s, Sample(prompt="")).mismatches for s in served.records)
    expect("recorded", stats.recorded, n * turns)
    expect("records returned", len(records), n * turns)
    expect("token_in_turns", stats.token_in_turns, n * (turns - 1))
    expect("templated_turns", stats.templated_turns, n)
    extending = sum(r.prefix_len > 0 for r in records)
    expect("records extending the trajectory", extending, n * (turns - 1))
    expect("tito mismatches", mismatches, 0)
    expect("opened/closed/open", (stats.opened, stats.closed, stats.open_sessions), (n, n, 0))
    expect("engine errors", stats.engine_errors, 0)
    return len(records), mismatches


def _counters(stats: SessionServerStatistics) -> dict[str, int]:
    """Every counter of the server."""
    return dataclasses.asdict(stats)


# -- 2. memory of one long session --------------------------------------------------------


def fresh_bytes(lists: list[list[int]]) -> int:
    """tracemalloc's count for a fresh copy of ``lists`` (pickle does not share ints:
    each id gets its own object, as when decoded from the engine's JSON)."""
    data = pickle.dumps(lists, protocol=pickle.HIGHEST_PROTOCOL)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    copy = pickle.loads(data)
    after = tracemalloc.get_traced_memory()[0]
    del copy
    if started:
        tracemalloc.stop()
    return after - before


async def long_session(
    url: str, tokenizer: Any, turns: int, tokens: int, client: str
) -> dict[str, Any]:
    async with serve(url, tokenizer, 1, tokens) as served:
        await chat_turns(served.open_one, served.close_one, client, 1, turns, tokens, "long", [])
        stats = served.server.statistics()
    (records,) = served.records
    expect("recorded", stats.recorded, turns)
    expect("token_in_turns", stats.token_in_turns, turns - 1)
    prompts = list(full_prompts(records))
    trajectory = len(prompts[-1]) + len(records[-1].output_ids)
    held = [list(r.prompt_ids) for r in records] + [list(r.output_ids) for r in records]
    full = prompts + [list(r.output_ids) for r in records]
    held_ids, full_ids = sum(map(len, held)), sum(map(len, full))
    expect("record ids == trajectory", held_ids, trajectory)
    row = {
        "turns": turns,
        "trajectory_tokens": trajectory,
        "record_ids": held_ids,
        "full_prompt_ids": full_ids,
        "full_over_records": full_ids / held_ids,
        "record_list_bytes": sum(map(sys.getsizeof, held)),
        "full_list_bytes": sum(map(sys.getsizeof, full)),
        "record_traced_bytes": fresh_bytes(held),
        "full_traced_bytes": fresh_bytes(full),
        "counters": _counters(stats),
    }
    return row


# -- 3. abandoned sessions ----------------------------------------------------------------


async def wave(served: Served, n: int, tokens: int, *, turn: bool, close: bool) -> None:
    """``n`` agents, 64 at a time (light aiohttp agent): each opens a session, sends one
    turn (``turn``), and closes its session (``close``) or abandons it."""
    limit = anyio.Semaphore(64)
    async with chat_client("aiohttp") as for_session:

        async def one() -> None:
            async with limit:
                session = await served.server.open_session(served.run)
                if turn:
                    messages = [{"role": "user", "content": "Solve the task."}]
                    await for_session(session.base_url, session.api_key)(messages, tokens)
                if close:
                    served.records.append(await served.server.close_session(session.id))

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)


async def settled() -> tuple[float, float, int]:
    """Traced MB (after a full collection), RSS MB and the turn records alive, once
    closed connections are gone."""
    await anyio.sleep(0.2)
    traced = traced_mb()
    records = sum(isinstance(o, TurnRecord) for o in gc.get_objects())
    return traced, rss_mb(), records


async def abandoned(url: str, tokenizer: Any, n: int, ttl: float, tokens: int) -> dict[str, Any]:
    """``n`` sessions opened and never closed, half of them after one turn; memory before,
    with them held, and after the idle sweep. The baseline is taken after a wave of closed
    sessions at the same concurrency, so that the connection pools are already at their
    steady size and are not counted as left behind."""
    warm, turned = min(n, 256), n // 2
    tracemalloc.start()
    try:
        async with serve(url, tokenizer, 64, tokens, idle_ttl_s=ttl) as served:
            server = served.server
            await wave(served, warm, tokens, turn=True, close=True)
            served.records.clear()
            base = await settled()
            base_snapshot = tracemalloc.take_snapshot()
            started = time.monotonic()
            # The sessions with a turn first: the idle ones take no time to open, so all
            # of them are still open when the held memory is measured (ttl permitting).
            await wave(served, turned, tokens, turn=True, close=False)
            with_turn = await settled()
            await wave(served, n - turned, tokens, turn=False, close=False)
            load_s = time.monotonic() - started
            held_open = server.statistics().open_sessions
            held = await settled()
            with anyio.fail_after(ttl * 3 + 30):
                # The sweep is the server's own task: its counters are what there is to watch.
                while server.statistics().open_sessions:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            swept_s = time.monotonic() - started - load_s
            stats = server.statistics()
            after = await settled()
            left = tracemalloc.take_snapshot().compare_to(base_snapshot, "lineno")[:5]
            peak_traced = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    expect("expired", stats.expired, n)
    expect("open_sessions", stats.open_sessions, 0)
    expect("recorded", stats.recorded, warm + turned)
    expect("closed", stats.closed, warm)
    expect("turn records alive after the sweep", after[2], base[2])
    return {
        "sessions": n,
        "turns": turned,
        "idle_ttl_s": ttl,
        "load_s": load_s,
        "open_when_held": held_open,
        "swept_after_load_s": swept_s,
        "traced_mb": {"base": base[0], "held": held[0], "after": after[0]},
        "traced_peak_mb": peak_traced,
        "rss_mb": {"base": base[1], "held": held[1], "after": after[1]},
        "turn_records_alive": {"base": base[2], "held": held[2], "after": after[2]},
        "kb_per_session_with_turn": 1024 * (with_turn[0] - base[0]) / max(turned, 1),
        "kb_per_idle_session": 1024 * (held[0] - with_turn[0]) / max(n - turned, 1),
        "left_kb_after_sweep": 1024 * (after[0] - base[0]),
        # Where what is left was allocated (tracemalloc's top lines, KiB): what to look at
        # when it is more than containers that held n entries.
        "left_by_line_kb": [[str(d.traceback), d.size_diff / 1024] for d in left],
        "counters": _counters(stats),
    }


# -- 4. a degenerate tool-call turn ------------------------------------------------------


@dataclass
class TimedParser:
    """The default tool-call parser, timed: (start, end, thread CPU s, chars) per call."""

    calls: list[tuple[float, float, float, int]] = field(default_factory=list)

    def __call__(self, text: str) -> list[ToolCall | ToolCallError]:
        cpu, start = time.thread_time(), time.perf_counter()
        calls = parse_qwen_tool_calls(text)
        self.calls.append((start, time.perf_counter(), time.thread_time() - cpu, len(text)))
        return calls


async def _no_tool(name: str, arguments: dict[str, Any]) -> str:
    return "no such tool"


async def degenerate_turn(url: str, tokenizer: Any, variant: str, budget: int) -> dict[str, Any]:
    """One multi-turn sample whose first model turn is ``variant``; the loop's lag (a
    1 ms ticker) over the rollout and over the parse of that turn, in wall time and in
    the loop thread's CPU time (a tick that waited for a core another process held is
    late without the loop having done anything)."""
    parser = TimedParser()
    config = TextRolloutConfig(
        n_samples_per_prompt=1, sampling=TextSamplingParams(max_new_tokens=budget)
    )
    generate = MultiTurn(MultiTurnOptions(max_turns=2, parser=parser, execute_tool=_no_tool))
    ticks: list[tuple[float, float, float]] = []  # start, end, loop thread CPU s
    done = anyio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0, c0 = time.perf_counter(), time.thread_time()
            await anyio.sleep(0.001)
            ticks.append((t0, time.perf_counter(), time.thread_time() - c0))

    # Garbage collections are timed too: a loop tick that holds one is not the parse's.
    pauses: list[tuple[float, float]] = []
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            pauses.append((gc_started[0], time.perf_counter()))

    rollout = TextRollout.open([url], tokenizer=tokenizer, config=config, generate=generate)
    gc.callbacks.append(on_gc)
    try:
        async with rollout as r, anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0.01)
            t0 = time.perf_counter()
            result = await r.run([f"Write the {variant} answer."])
            wall = time.perf_counter() - t0
            done.set()
    finally:
        gc.callbacks.remove(on_gc)
    (sample,) = result.samples
    start, end, cpu, chars = parser.calls[0]

    during = [t for t in ticks if t[0] <= end and t[1] >= start]

    def lag(selected: list[tuple[float, float, float]]) -> float:
        return 1000 * max((max(0.0, b - a - 0.001) for a, b, _ in selected), default=0.0)

    def cpu_ms(selected: list[tuple[float, float, float]]) -> float:
        return 1000 * max((c for _, _, c in selected), default=0.0)

    def gc_in_worst(selected: list[tuple[float, float, float]]) -> float:
        """Milliseconds of garbage collection inside the tick of most CPU."""
        if not selected:
            return 0.0
        a, b, _ = max(selected, key=lambda tick: tick[2])
        return 1000 * sum(max(0.0, min(e, b) - max(s, a)) for s, e in pauses)

    return {
        "variant": variant,
        "status": sample.status.value,
        "turns": sample.turns,
        "first_turn_chars": chars,
        "first_turn_tokens": _first_turn_tokens(sample),
        "response_tokens": sample.response_length,
        "parse_cpu_ms": 1000 * cpu,
        "parse_wall_ms": 1000 * (end - start),
        "max_lag_during_parse_ms": lag(during),
        "max_tick_cpu_during_parse_ms": cpu_ms(during),
        "max_lag_rollout_ms": lag(ticks),
        "max_tick_cpu_rollout_ms": cpu_ms(ticks),
        "gc_in_worst_tick_ms": gc_in_worst(ticks),
        "max_gc_pause_ms": 1000 * max((e - s for s, e in pauses), default=0.0),
        "rollout_s": wall,
    }


def _first_turn_tokens(sample: Sample) -> int:
    """The model's first turn: the loss mask's first run of ones."""
    mask = sample.loss_mask or []
    return mask.index(0) if 0 in mask else len(mask)


def degenerate_rules(tokens: int) -> tuple[TextRule, ...]:
    unclosed = DEGENERATE_UNIT * (tokens // 2)
    return (
        TextRule(r"<tool_response>", "Done."),
        TextRule(r"unclosed", unclosed),
        TextRule(r"closed", unclosed + "</tool_call>"),
        TextRule(r"plain", "x " * tokens),
    )


async def degenerate(url: str, tokenizer: Any, tokens: int, repeats: int) -> dict[str, Any]:
    rows = [
        await degenerate_turn(url, tokenizer, variant, tokens + 1024)
        for _ in range(repeats)
        for variant in ("plain", "unclosed", "closed")
    ]
    # Per variant, the run with the worst loop tick (its other figures with it), and the
    # most parse CPU of any run.
    by: dict[str, dict[str, Any]] = {}
    for row in rows:
        same = [r for r in rows if r["variant"] == row["variant"]]
        worst = max(same, key=lambda r: r["max_tick_cpu_rollout_ms"])
        by[row["variant"]] = dict(
            worst, runs=len(same), parse_cpu_ms=max(r["parse_cpu_ms"] for r in same)
        )
    expect("unclosed turn", (by["unclosed"]["status"], by["unclosed"]["turns"]), ("completed", 0))
    expect("closed-once turn (told, answered)", by["closed"]["turns"], 1)
    return by


# -- run, table ---------------------------------------------------------------------------


def load() -> dict[str, Any]:
    one, five, fifteen = os.getloadavg()
    return {"cpus": os.cpu_count(), "loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)]}


FIGURES = ("agents", "memory", "degenerate", "abandoned")


@dataclass
class Setup:
    """What the figures run against: the tokenizer and the engines' URLs."""

    tokenizer: Any = None
    instant: str = ""
    slow: str = ""
    stand_in: str = ""


async def set_up(args: argparse.Namespace, stack: AsyncExitStack) -> Setup:
    """Load the tokenizer and start the engines the figures need, all stopped when
    ``stack`` closes. One after another: each child imports this module and loads for
    seconds, and started side by side on a loaded 2-core machine the mocks missed their
    60 s start timeout."""
    from miles_lite.testing import load_qwen3_tokenizer

    setup = Setup()

    async def tokenizer() -> None:
        setup.tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)

    async def mock(name: str, latency_s: float) -> None:
        process = MockProcess(latency_s, args.tokens)
        setattr(setup, name, await anyio.to_thread.run_sync(process.__enter__))
        stack.push_async_callback(anyio.to_thread.run_sync, process.__exit__, None, None, None)

    async def stand_in() -> None:
        config = TextStandInConfig(
            policy=TextPolicy(rules=degenerate_rules(args.degenerate_tokens)),
            context_length=2 * args.degenerate_tokens + 4096,
        )
        setup.stand_in = (await stack.enter_async_context(TextEngineProcess(config))).url

    figures = set(args.figures)
    await tokenizer()
    if figures & {"agents", "memory", "abandoned"}:
        await mock("instant", 0.0)
    if "agents" in figures and not args.quick:
        await mock("slow", args.token_latency_ms / 1000)
    if "degenerate" in figures:
        await stand_in()
    return setup


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        setup = await set_up(args, stack)
        gc.freeze()  # as text_layer.py: the imports' heap, never collected again
        return await run_figures(args, setup)


async def run_figures(args: argparse.Namespace, setup: Setup) -> dict[str, Any]:
    tokenizer, instant, slow = setup.tokenizer, setup.instant, setup.slow
    out: dict[str, Any] = {"load_start": load(), "seconds": {}}
    tokens, client = args.tokens, args.client
    for figure in args.figures:
        started = time.perf_counter()
        if figure == "agents":
            # Warm both chat paths (lazy imports, first connections) before measuring.
            await agents(instant, tokenizer, 2, 2, tokens, client, "warm-up")
            engines_ = [("instant", instant)]
            if slow:
                engines_.append((f"{tokens} tokens x {args.token_latency_ms:g} ms", slow))
            out["agents"] = []
            for name, url in engines_:
                row = await agents(
                    url, tokenizer, args.agents, args.turns, tokens, client, name, args.rounds
                )
                out["agents"].append(dict(row, engine=name))
        elif figure == "memory":
            out["memory"] = await long_session(
                instant, tokenizer, args.session_turns, tokens, client
            )
        elif figure == "degenerate":
            out["degenerate"] = await degenerate(
                setup.stand_in, tokenizer, args.degenerate_tokens, args.repeats
            )
        else:
            out["abandoned"] = await abandoned(instant, tokenizer, args.abandoned, args.ttl, tokens)
        out["seconds"][figure] = time.perf_counter() - started
    out["load_end"] = load()
    return out


def table(r: dict[str, Any]) -> str:
    lines = [
        "| figure | through the session server | baseline (same run) | ratio |",
        "|---|---|---|---:|",
    ]
    for a in r.get("agents", []):
        c = a["counters"]
        what = f"1. {a['agents']} agents x {a['turns']} turns, {a['engine']} engine"
        cpu = a["cpu_ms_per_turn"]
        lines.append(
            f"| {what}, {a['rounds']} rounds: turn latency p50 / p99; main-process CPU per"
            f" turn | {a['server_p50_ms']:.0f} / {a['server_p99_ms']:.0f} ms;"
            f" {cpu['server']:.1f} ms (recorded {c['recorded']}, token in"
            f" {c['token_in_turns']} a round) | direct: {a['direct_p50_ms']:.0f} /"
            f" {a['direct_p99_ms']:.0f} ms; {cpu['direct']:.1f} ms | {a['p50_ratio']:.2f}x /"
            f" {a['p99_ratio']:.2f}x; {cpu['server'] / cpu['direct']:.2f}x |"
        )
    if "memory" in r:
        m = r["memory"]
        lines.append(
            f"| 2. one {m['turns']}-turn session ({m['trajectory_tokens']} tokens): ids held"
            f" | records: {m['record_ids']} ids, {m['record_list_bytes'] / 1024:.0f} KiB"
            f" lists, {m['record_traced_bytes'] / 1024:.0f} KiB traced | full prompts:"
            f" {m['full_prompt_ids']} ids, {m['full_list_bytes'] / 1024:.0f} KiB lists,"
            f" {m['full_traced_bytes'] / 1024:.0f} KiB traced | {m['full_over_records']:.1f}x"
            " less |"
        )
    if "abandoned" in r:
        b = r["abandoned"]
        t, s = b["traced_mb"], b["rss_mb"]
        lines.append(
            f"| 3. {b['sessions']} abandoned sessions ({b['turns']} with a turn; "
            f"{b['open_when_held']} open when measured), ttl {b['idle_ttl_s']:g} s: traced /"
            f" RSS MB | held {t['held']:.1f} / {s['held']:.0f}, after the sweep"
            f" {t['after']:.1f} / {s['after']:.0f} (expired {b['counters']['expired']}, open"
            f" {b['counters']['open_sessions']}) | before: {t['base']:.1f} / {s['base']:.0f}"
            f" | {b['kb_per_session_with_turn']:.1f} KiB per session with a turn,"
            f" {b['kb_per_idle_session']:.1f} KiB per idle one,"
            f" {b['left_kb_after_sweep']:+.0f} KiB left; turn records alive: held"
            f" {b['turn_records_alive']['held'] - b['turn_records_alive']['base']:+d}, after"
            f" {b['turn_records_alive']['after'] - b['turn_records_alive']['base']:+d} |"
        )
    if "degenerate" in r:
        d = r["degenerate"]
        plain = d["plain"]

        def steps(v: dict[str, Any]) -> str:
            return (
                f"{v['max_tick_cpu_during_parse_ms']:.1f} / {v['max_tick_cpu_rollout_ms']:.1f}"
                f" ms CPU ({v['max_lag_during_parse_ms']:.0f} / {v['max_lag_rollout_ms']:.0f}"
                f" ms wall; {v['gc_in_worst_tick_ms']:.1f} ms of it garbage collection)"
            )

        for variant in ("unclosed", "closed"):
            v = d[variant]
            ratio = v["max_tick_cpu_rollout_ms"] / max(plain["max_tick_cpu_rollout_ms"], 1e-3)
            lines.append(
                f"| 4. {v['first_turn_tokens']}-token degenerate turn ({variant}): parse CPU;"
                f" worst loop tick in the parse / the rollout | {v['parse_cpu_ms']:.2f} ms;"
                f" {steps(v)} | plain {plain['first_turn_tokens']}-token turn:"
                f" {plain['parse_cpu_ms']:.2f} ms; {steps(plain)} | {ratio:.2f}x |"
            )
    return "\n".join(lines)


def commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (the smoke test)")
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per chat turn")
    parser.add_argument("--token-latency-ms", type=float, default=10.0)
    parser.add_argument("--client", choices=("openai", "aiohttp"), default="openai")
    parser.add_argument(
        "--rounds", type=int, default=3, help="figure 1: rounds of each path, alternating"
    )
    parser.add_argument("--session-turns", type=int, default=60)
    parser.add_argument("--abandoned", type=int, default=5000)
    parser.add_argument(
        "--ttl",
        type=float,
        default=60.0,
        help="idle_ttl_s of figure 3: longer than its load takes, so that every session is"
        " still open when the held memory is measured (the run reports how many were)",
    )
    parser.add_argument("--degenerate-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each figure-4 turn")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sessions.json")
    parser.add_argument(
        "--figures",
        type=lambda text: text.split(","),
        default=list(FIGURES),
        help=f"the figures to measure, comma-separated (default: {','.join(FIGURES)})",
    )
    args = parser.parse_args(argv)
    unknown = set(args.figures) - set(FIGURES)
    if unknown:
        parser.error(f"--figures: unknown {sorted(unknown)}; choose from {','.join(FIGURES)}")
    if args.quick:
        # ttl: a session whose first request comes later than this after it opened is
        # expired before it (a 404); 1 s was too short on a loaded machine.
        args.agents, args.turns, args.session_turns = 20, 5, 12
        args.abandoned, args.ttl, args.repeats, args.rounds = 200, 5.0, 1, 1
        args.degenerate_tokens = 4096
    started = time.perf_counter()
    result = run_sync(run_all, args)
    result["seconds"]["total"] = time.perf_counter() - started
    result["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    result["commit"] = commit()
    result["quick"] = args.quick
    print(table(result))
    line = json.dumps({"sessions": result})
    print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
