"""What the text rollout layer itself costs, side by side with a bare client, in one run.

    python benchmarks/text_layer.py --quick     # under a minute
    python benchmarks/text_layer.py             # the default workload
    python benchmarks/text_layer.py --help      # every size, count and latency is a flag

A fast mock engine in its own process (``text_mock.py``: prebuilt answers, so it never caps
the measurement) answers ``/generate`` and ``/v1/chat/completions``. Modes, each next to its
baseline in the same run:

- ``generate@C``: ``TextRollout`` single turn, C requests in flight, against a bare aiohttp
  client sending the same prebuilt requests at the same concurrency (the floor any Python
  client pays); ``--generate-pairs`` alternating pairs, the pair of median ratio reported
  with the lowest and highest ratio of all (``pair_ratio_min`` / ``pair_ratio_max``);
- ``latency@C``: the same over a mock holding each request ``tokens x latency``: the
  layer's added latency (end to end minus the mock's service time), p50 / p99;
- ``chat-latency@C`` / ``chat-aiohttp-latency@C``: agent turns over the holding mock
  (``openai`` client / light aiohttp agent): added latency through the session server,
  and over the same client talking straight to the engine;
- ``chat@C``: agent turns with the real ``openai`` client through the session server
  (TITO records, sample assembly) against the same client talking straight to the engine;
  ``chat-aiohttp@C``: the same with a light aiohttp agent, so the session server, not the
  client, is what bounds the turns/s; ``chat-aiohttp-procs@C``: the same with the session
  server in worker processes (``--chat-processes``, ``SessionServerConfig.processes``):
  the CPU column is still this (the rollout's) process's, the workers' own in
  ``worker_cpu_ms_per_turn``. Each session server is warmed up first (a worker's first
  turns load what it loads lazily, once in a training run); ``--chat-pairs`` alternating
  direct / session-server pairs on one server, the pair of median ratio reported with
  the range of all (a pair is 512 turns, about half a second: one moves by 20-40% from
  the next); ``--chat-rounds R``: each agent runs R sessions back to back, the sustained
  rate instead of a burst of C sessions (a burst's direct arm moves the most: 4,000 to
  7,900 turns/s here, where it sustains 6,500-7,800);
- ``agents-out-procs@C`` / ``agents-out@C`` (``--agents-out-sessions``, default 256): the
  light agents in a load child process, as a harness runs its agents outside the rollout's
  process, against the session server in worker processes / in-process; this process
  runs only the session server (and closes and assembles the sessions), so its loop lag
  is what the library puts on the rollout's loop. ``-latency``: over the latency mock (a
  saturated zero-latency engine makes any loop busy). The agents' own CPU and loop lag
  are in ``agents_cpu_ms_per_turn`` / ``agents_lag_p99_ms``;
- ``miles@C`` / ``miles-aiohttp@C`` (default run, or ``--miles-peer``): the same loads
  through miles' own session server and client-side sample assembly (``miles-rl`` 0.0.2 in
  a venv of its own, built by ``miles_peer/setup.sh``; its server runs in its own process);
- ``turns@K``: one session of K turns (light agent): time per turn and TITO assembly per
  turn;
- ``stop``: an oversampled rollout stopping early with N requests in flight: time from the
  stop to nothing running at the engine.

Every mode also checks correctness: token ids and log-probs equal the mock's ground
truth, masks and invariants hold, no rid generated twice. Prints a table, one JSON line,
and writes a PNG chart. Measured: requests/s, output tokens/s, main-process CPU per 1,000
requests, event-loop lag (1 ms ticker) p50/p99/max, peak RSS.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import anyio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_agents import chat_client
from text_mock import MockProcess, output_ids, output_log_prob

from miles_lite import TextRollout, TextRolloutConfig, TextSamplingParams, run_sync
from miles_lite.engine.config import EngineClientConfig, EngineConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.rollout.context import RunContext
from miles_lite.rollout.contract import GenerateFnInput
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.types import Sample, SampleStatus

HERE = Path(__file__).resolve().parent
#: The agents' HTTP clients, each a set of chat rows (see chat_client).
CHAT_CLIENTS = ("openai", "aiohttp")


@dataclass
class Measure:
    """One mode's figures."""

    mode: str
    baseline: str
    requests: int
    seconds: float
    output_tokens: int
    cpu_s: float
    lags_ms: list[float] = field(default_factory=list)
    #: The loop thread's CPU time in each tick (ms): the part of a tick's lag that is the
    #: loop's own work, not a wait for a core.
    tick_cpu_ms: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def lag(self, q: float) -> float:
        return quantile(self.lags_ms, q)

    def row(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "requests": self.requests,
            "requests_per_s": round(self.rps, 1),
            "output_tokens_per_s": round(self.tokens_per_s, 1),
            "cpu_ms_per_1k_requests": round(1e6 * self.cpu_s / max(self.requests, 1), 1),
            "loop_lag_ms": {
                "p50": round(self.lag(0.5), 2),
                "p99": round(self.lag(0.99), 2),
                "max": round(max(self.lags_ms, default=0.0), 2),
            },
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            **{k: round(v, 4) for k, v in self.extra.items()},
        }


R = TypeVar("R")


def median_run(runs: list[R], pair: Callable[[R], tuple[Measure, Measure]]) -> R:
    """The run whose (layer, baseline) ``pair`` has the median throughput ratio; with
    several, the lowest and highest ratio of all go in its layer's notes
    (``pair_ratio_min`` / ``pair_ratio_max``)."""

    def ratio(run: R) -> float:
        layer, baseline = pair(run)
        return layer.rps / baseline.rps

    ranked = sorted(runs, key=ratio)
    chosen = ranked[len(ranked) // 2]
    if len(ranked) > 1:
        notes = pair(chosen)[0].extra
        notes["pair_ratio_min"], notes["pair_ratio_max"] = ratio(ranked[0]), ratio(ranked[-1])
    return chosen


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def probe(mode: str, baseline: str) -> AsyncIterator[Measure]:
    """Measure wall time, main-process CPU, loop lag (1 ms ticker; the loop thread's CPU in
    each tick) and peak RSS."""
    measure = Measure(mode, baseline, 0, 0.0, 0, 0.0)
    process = psutil.Process()
    done = anyio.Event()

    async def ticker() -> None:
        last_rss = time.monotonic()
        while not done.is_set():
            t0, c0 = time.perf_counter(), time.thread_time()
            await anyio.sleep(0.001)
            measure.lags_ms.append(max(0.0, (time.perf_counter() - t0 - 0.001) * 1000))
            measure.tick_cpu_ms.append((time.thread_time() - c0) * 1000)
            if time.monotonic() - last_rss > 0.05:
                measure.peak_rss_mb = max(measure.peak_rss_mb, process.memory_info().rss / 2**20)
                last_rss = time.monotonic()

    cpu0, t0 = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        try:
            yield measure
        finally:
            measure.seconds = time.perf_counter() - t0
            measure.cpu_s = time.process_time() - cpu0
            done.set()


def token_groups(n_requests: int, group: int, prompt_tokens: int) -> list[list[Sample]]:
    """Groups of token-prompt samples (prebuilt: the layer does not tokenize here)."""
    prompt = [100 + i % 900 for i in range(prompt_tokens)]
    return [
        [
            Sample(
                index=g * group + j,
                group_index=g,
                prompt="",
                tokens=list(prompt),
                seed=g * group + j,
            )
            for j in range(group)
        ]
        for g in range(n_requests // group)
    ]


def engines(inflight: int) -> EngineConfig:
    """The layer's engine settings: ``inflight`` requests at the mock, no retries, enough
    connections for all of them."""
    return EngineConfig(
        router=RouterConfig(max_inflight_per_engine=inflight),
        client=EngineClientConfig(
            retry=RetryPolicy(max_attempts=1), max_connections=4096, max_connections_per_host=4096
        ),
    )


def check(samples: list[Sample], n: int, prompt_tokens: int) -> int:
    """Correctness against the mock's ground truth; returns output tokens."""
    want_ids = output_ids(n)
    want_lp = [output_log_prob(i) for i in range(n)]
    for s in samples:
        s.validate()
        out = s.tokens[prompt_tokens:]
        if out != want_ids or s.rollout_log_probs != want_lp or s.loss_mask != [1] * n:
            raise AssertionError(f"sample {s.index}: ids or log-probs differ from the mock's")
    return n * len(samples)


async def mock_stats(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(f"{url}/_mock/stats") as resp:
        return dict(await resp.json())


async def mock_reset(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(f"{url}/_mock/reset") as resp:
        await resp.read()


async def bare_generate(
    url: str, n_requests: int, concurrency: int, n: int, prompt_tokens: int, mode: str
) -> tuple[Measure, list[float]]:
    """The floor: prebuilt /generate bodies posted by one aiohttp session at ``concurrency``."""
    prompt = [100 + i % 900 for i in range(prompt_tokens)]
    bodies = [
        json.dumps(
            {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": n},
                "rid": os.urandom(16).hex(),
                "return_logprob": True,
            }
        ).encode()
        for _ in range(n_requests)
    ]
    latencies: list[float] = []
    limit = anyio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http, probe(mode, "") as m:

        async def one(body: bytes) -> None:
            async with limit:
                t0 = time.perf_counter()
                async with http.post(
                    f"{url}/generate", data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    answer = await resp.json()
                latencies.append(time.perf_counter() - t0)
                m.output_tokens += len(answer["meta_info"]["output_token_logprobs"])
                m.requests += 1

        async with anyio.create_task_group() as tg:
            for body in bodies:
                tg.start_soon(one, body)
    return m, latencies


async def layer_generate(
    url: str,
    n_requests: int,
    concurrency: int,
    n: int,
    prompt_tokens: int,
    mode: str,
    tokenizer: Any,
) -> tuple[Measure, list[float]]:
    """The same requests through TextRollout (single turn)."""
    config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=n),
        engines=engines(concurrency),
    )
    groups = token_groups(n_requests, 4, prompt_tokens)
    async with TextRollout.open([url], tokenizer=tokenizer, config=config) as rollout:
        async with probe(mode, "") as m:
            result = await rollout.run(groups)
        samples = result.samples
        m.requests = len(samples)
        m.output_tokens = check(samples, n, prompt_tokens)
    latencies = [
        s.generate_end - s.generate_start
        for s in result.spans
        if s.generate_end and s.generate_start
    ]
    return m, latencies


async def chat_turns(
    base_url_for: Callable[[], Awaitable[tuple[str, str]]],
    close: Callable[[str], Awaitable[Any]],
    client: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    mode: str,
    latencies: list[float],
    rounds: int = 1,
) -> Measure:
    """``sessions`` agents at once, each running ``rounds`` sessions back to back (one, a
    burst; more, the sustained rate) of ``turns`` chat turns with ``client`` (see
    :func:`chat_client`); each turn's end-to-end time goes to ``latencies``."""
    async with chat_client(client) as for_session, probe(mode, "") as m:

        async def session() -> None:
            base_url, key = await base_url_for()
            send = for_session(base_url, key)
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Solve the task."}]
            try:
                for turn in range(turns):
                    t0 = time.perf_counter()
                    content, tokens = await send(messages, max_tokens)
                    latencies.append(time.perf_counter() - t0)
                    m.requests += 1
                    m.output_tokens += tokens
                    messages.append({"role": "assistant", "content": content})
                    messages.append({"role": "tool", "content": f"result {turn}"})
            finally:
                await close(key)

        async def agent() -> None:
            for _ in range(rounds):
                await session()

        async with anyio.create_task_group() as tg:
            for _ in range(sessions):
                tg.start_soon(agent)
    return m


@dataclass
class ChatRun:
    """Agent turns through the session server, and the same client straight to the engine."""

    layer: Measure
    direct: Measure
    layer_latencies: list[float]
    direct_latencies: list[float]


class ServedSessions:
    """A session server in front of the mock for one chat mode: opens and closes the
    agents' sessions, assembles each closed session's records into samples (as
    ``AgentGenerate`` does, on the rollout's loop) and keeps the records, checked against
    the mock's ground truth by :meth:`check` once the measurement is over."""

    def __init__(self, server: Any, run: RunContext, turns: int, max_tokens: int) -> None:
        self.server = server
        self._run = run
        self._turns = turns
        self._max_tokens = max_tokens
        self._ids: dict[str, str] = {}
        self._records: list[list[TurnRecord]] = []
        self.assembly_s = 0.0
        self.assembled = 0
        self.mismatches = 0

    async def open_one(self) -> tuple[str, str]:
        """Open a session: its base URL and API key."""
        session = await self.server.open_session(self._run)
        self._ids[session.api_key] = session.id
        return session.base_url, session.api_key

    async def close_one(self, key: str) -> None:
        """Close the session of API key ``key`` and assemble its samples."""
        from miles_lite.agentic.assembly import assemble_samples

        records = await self.server.close_session(self._ids[key])
        t0 = time.perf_counter()
        assembly = assemble_samples(records, Sample(prompt=""))
        self.assembly_s += time.perf_counter() - t0
        self.assembled += len(records)
        self.mismatches += assembly.mismatches
        for sample in assembly.samples:
            sample.validate()
        self._records.append(records)

    def reset(self) -> None:
        """Forget the sessions closed so far (a new measurement on the same server)."""
        self._records.clear()
        self.assembly_s, self.assembled, self.mismatches = 0.0, 0, 0

    async def warm_up(self) -> None:
        """Two sessions of two turns a worker (or two in-process), not recorded here: a
        worker's first turns load what it loads lazily, once per process in a training
        run."""

        async def close(key: str) -> None:
            await self.server.close_session(self._ids.pop(key))

        workers = max(len(self.server.worker_pids()), 1)
        await chat_turns(self.open_one, close, "aiohttp", 2 * workers, 2, self._max_tokens, "", [])

    def check(self, sessions: int) -> None:
        """Every session closed with exactly one record a turn, each record's ids and
        log-probs the mock's ground truth."""
        want_ids = output_ids(self._max_tokens)
        want_lp = [output_log_prob(i) for i in range(self._max_tokens)]
        if len(self._records) != sessions:
            raise AssertionError(f"{len(self._records)} sessions closed, not {sessions}")
        for records in self._records:
            if len(records) != self._turns:
                raise AssertionError(f"a session has {len(records)} records, not {self._turns}")
            for r in records:
                if r.output_ids != want_ids or r.output_log_probs != want_lp:
                    raise AssertionError(f"record {r.rid}: ids or log-probs differ from the mock's")

    def note(self, layer: Measure) -> None:
        """The assembly's figures in ``layer``'s notes."""
        layer.extra["assembly_ms_per_turn"] = 1000 * self.assembly_s / max(self.assembled, 1)
        layer.extra["tito_mismatches"] = float(self.mismatches)


@asynccontextmanager
async def served_sessions(
    url: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    tokenizer: Any,
    processes: int | Literal["auto"],
) -> AsyncIterator[ServedSessions]:
    """A session server (in-process, or in ``processes`` worker processes) on the mock at
    ``url``, routing up to ``sessions`` turns at once."""
    from miles_lite.agentic.config import SessionServerConfig
    from miles_lite.agentic.server import SessionServer
    from miles_lite.text.context import TextContext

    router_config = RouterConfig(max_inflight_per_engine=max(sessions, 1))
    async with (
        EngineClient(EngineClientConfig(retry=RetryPolicy(max_attempts=1))) as engine_client,
        Router([url], engine_client, router_config) as router,
    ):
        context = TextContext(tokenizer, router, TextSamplingParams(max_new_tokens=max_tokens))
        config = SessionServerConfig(processes=processes)
        async with SessionServer(context, config) as server:
            yield ServedSessions(server, RunContext(0), turns, max_tokens)


class WorkerCPU:
    """The session server's worker processes' CPU since it was made."""

    def __init__(self, server: Any) -> None:
        self._workers = [psutil.Process(pid) for pid in server.worker_pids()]
        self._cpu0 = self._cpu()

    def _cpu(self) -> float:
        return sum(sum(w.cpu_times()[:2]) for w in self._workers)

    def note(self, layer: Measure) -> None:
        """The workers' CPU per turn in ``layer``'s notes (none in-process)."""
        if self._workers:
            worker_cpu = self._cpu() - self._cpu0
            layer.extra["worker_cpu_ms_per_turn"] = 1000 * worker_cpu / max(layer.requests, 1)


def keyless(base_url: str) -> Callable[[], Awaitable[tuple[str, str]]]:
    """A session opener for agents that need no session: ``base_url`` and no key."""

    async def opened() -> tuple[str, str]:
        return base_url, "none"

    return opened


async def keep(key: str) -> None:
    """The closer of a :func:`keyless` session: nothing to close."""


async def run_chat(
    url: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    tokenizer: Any,
    mode: str = "chat",
    client: str = "openai",
    processes: int | Literal["auto"] = 0,
    pairs: int = 1,
    rounds: int = 1,
) -> ChatRun:
    """``client`` straight to the engine, then through a session server (warmed up first,
    as a training run's is after its first turns), ``pairs`` times in turn on the same
    server: the pair of median ratio, with the lowest and highest ratio of all in the
    layer's notes (``pair_ratio_min`` / ``pair_ratio_max``). ``rounds``: sessions each
    agent runs back to back (see :func:`chat_turns`)."""

    direct = keyless(f"{url}/v1")
    direct_name = "openai-direct" if client == "openai" else f"{client}-direct"
    direct_mode = f"{direct_name}{mode.removeprefix('chat').removeprefix(f'-{client}')}@{sessions}"
    runs: list[ChatRun] = []
    async with served_sessions(url, sessions, turns, max_tokens, tokenizer, processes) as served:
        await served.warm_up()
        for _ in range(pairs):
            direct_latencies: list[float] = []
            bare = await chat_turns(
                direct,
                keep,
                client,
                sessions,
                turns,
                max_tokens,
                direct_mode,
                direct_latencies,
                rounds=rounds,
            )
            latencies: list[float] = []
            served.reset()
            workers = WorkerCPU(served.server)
            layer = await chat_turns(
                served.open_one,
                served.close_one,
                client,
                sessions,
                turns,
                max_tokens,
                f"{mode}@{sessions}",
                latencies,
                rounds=rounds,
            )
            workers.note(layer)
            served.check(sessions * rounds)
            served.note(layer)
            layer.baseline = bare.mode
            layer.extra["throughput_vs_direct"] = layer.rps / bare.rps
            runs.append(ChatRun(layer, bare, latencies, direct_latencies))
    return median_run(runs, lambda run: (run.layer, run.direct))


@asynccontextmanager
async def null_proxy(url: str) -> AsyncIterator[str]:
    """A proxy that does nothing, in this process, in front of the mock's chat endpoint: it
    reads each turn's bytes, posts them to the engine with one aiohttp session and returns
    the answer's bytes (no parsing, no records). Yields its base URL. What the two HTTP
    exchanges a proxied turn adds cost alone: the most any session server written with
    aiohttp can reach on this load (``proxy-floor-aiohttp@C``)."""
    from aiohttp import web

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            async with http.post(
                f"{url}/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as answer:
                data = await answer.read()
            return web.Response(body=data, status=answer.status, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        finally:
            await runner.cleanup()


async def run_proxy_floor(
    url: str, sessions: int, turns: int, max_tokens: int, pairs: int, rounds: int
) -> tuple[Measure, Measure]:
    """Light aiohttp agents through :func:`null_proxy` (``proxy-floor-aiohttp@C``) and
    straight to the engine, ``pairs`` times in turn: the pair of median ratio (see
    :func:`median_run`)."""

    direct = keyless(f"{url}/v1")
    runs: list[tuple[Measure, Measure]] = []
    async with null_proxy(url) as proxy_url:
        proxied = keyless(proxy_url)
        mode, direct_mode = f"proxy-floor-aiohttp@{sessions}", f"aiohttp-direct-floor@{sessions}"
        await chat_turns(proxied, keep, "aiohttp", sessions, 2, max_tokens, "", [])
        for _ in range(pairs):
            bare = await chat_turns(
                direct, keep, "aiohttp", sessions, turns, max_tokens, direct_mode, [], rounds
            )
            floor = await chat_turns(
                proxied, keep, "aiohttp", sessions, turns, max_tokens, mode, [], rounds
            )
            floor.baseline = bare.mode
            floor.extra["throughput_vs_direct"] = floor.rps / bare.rps
            runs.append((floor, bare))
    return median_run(runs, lambda run: run)


#: The load child's answer lines can hold every turn's latency (bytes).
_CHILD_LINE_BYTES = 1 << 24


async def run_agents_out(
    url: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    tokenizer: Any,
    mode: str,
    processes: int | Literal["auto"],
) -> Measure:
    """``sessions`` light aiohttp agents (:func:`chat_turns`) run by a load child process
    (a fresh interpreter: :func:`serve_agents`), as a harness runs its agents outside the
    rollout's process; this process runs the session server and measures its own loop.

    The child says ``ready`` once its imports are done; the measurement then opens every
    session here, hands their URLs and keys to the child (one line), and closes each one
    (assembling its samples) when the child says its agent is done, as ``AgentGenerate``
    does. The CPU and loop-lag columns are this (the rollout's) process's; the agents'
    own are in ``agents_cpu_ms_per_turn`` / ``agents_lag_p99_ms``."""
    from anyio.streams.buffered import BufferedByteReceiveStream

    command = [sys.executable, str(HERE / "text_layer.py"), "--serve-agents"]
    command += ["--chat-turns", str(turns), "--chat-tokens", str(max_tokens)]
    async with (
        served_sessions(url, sessions, turns, max_tokens, tokenizer, processes) as served,
        await anyio.open_process(command, stderr=None) as child,
    ):
        if child.stdin is None or child.stdout is None:
            raise RuntimeError("the agents' load child has no pipes")
        lines = BufferedByteReceiveStream(child.stdout)

        async def line() -> str:
            return (await lines.receive_until(b"\n", _CHILD_LINE_BYTES)).decode()

        if await line() != "ready":
            raise RuntimeError("the agents' load child did not start")
        await served.warm_up()
        workers = WorkerCPU(served.server)
        async with probe(f"{mode}@{sessions}", "") as m, anyio.create_task_group() as tg:
            opened: list[tuple[str, str]] = []

            async def open_one() -> None:
                opened.append(await served.open_one())

            async with anyio.create_task_group() as opening:
                for _ in range(sessions):
                    opening.start_soon(open_one)
            await child.stdin.send(json.dumps(opened).encode() + b"\n")
            while (said := await line()).startswith("done "):
                tg.start_soon(served.close_one, said.removeprefix("done "))
        m.requests = json.loads(said)["requests"]
        workers.note(m)
    result = json.loads(said)
    m.output_tokens = result["output_tokens"]
    m.extra["agents_cpu_ms_per_turn"] = 1000 * result["cpu_s"] / max(m.requests, 1)
    m.extra["agents_lag_p99_ms"] = result["lag_p99_ms"]
    m.extra["tick_cpu_p99_ms"] = quantile(m.tick_cpu_ms, 0.99)
    m.extra["turn_p50_ms"] = 1000 * quantile(result["latencies_s"], 0.5)
    if m.requests != sessions * turns:
        raise AssertionError(f"{m.requests} turns answered, not {sessions * turns}")
    served.check(sessions)
    served.note(m)
    return m


async def serve_agents(turns: int, max_tokens: int) -> None:
    """The load child of :func:`run_agents_out`: says ``ready``, reads one line (the
    sessions' ``[base_url, api_key]`` pairs), runs one light aiohttp agent a session
    (:func:`chat_turns`), says ``done <key>`` as each ends, then one JSON line: turns,
    output tokens, CPU seconds, turn latencies, its own loop's lag p99."""
    print("ready", flush=True)
    pairs = json.loads(await anyio.to_thread.run_sync(sys.stdin.readline))
    todo = [tuple(pair) for pair in reversed(pairs)]

    async def next_session() -> tuple[str, str]:
        return todo.pop()

    async def done(key: str) -> None:
        print(f"done {key}", flush=True)

    latencies: list[float] = []
    m = await chat_turns(
        next_session, done, "aiohttp", len(pairs), turns, max_tokens, "agents", latencies
    )
    result = {
        "requests": m.requests,
        "output_tokens": m.output_tokens,
        "cpu_s": m.cpu_s,
        "latencies_s": latencies,
        "lag_p99_ms": m.lag(0.99),
    }
    print(json.dumps(result), flush=True)


def add_latency(m: Measure, latencies: list[float], service_s: float) -> None:
    """The added latency (end to end minus the mock's service time), p50 and p99, in ms."""
    added = sorted(1000 * (v - service_s) for v in latencies)
    m.extra["added_latency_p50_ms"] = statistics.median(added)
    m.extra["added_latency_p99_ms"] = added[min(len(added) - 1, int(0.99 * len(added)))]


async def run_miles_peer(args: argparse.Namespace, url: str) -> list[Measure]:
    """miles' session server (miles-rl 0.0.2, in a venv of its own) on the chat load.

    The venv is built by ``miles_peer/setup.sh`` (idempotent). Its session server runs
    in its own process in front of the same mock; its agents and client-side sample
    assembly run in another (``miles_peer/agent_load.py``), as in miles. The CPU figure
    adds both processes.
    """
    from miles_lite.testing import qwen3_tokenizer_dir

    setup = [str(HERE / "miles_peer" / "setup.sh"), str(args.miles_venv)]
    await anyio.run_process(setup, stdout=None, stderr=None)
    python = str(args.miles_venv / "bin" / "python")
    tokenizer = str(qwen3_tokenizer_dir())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    session_url = f"http://127.0.0.1:{port}"
    server_cmd = [python, str(HERE / "miles_peer" / "session_server.py")]
    server_cmd += ["--tokenizer", tokenizer, "--port", str(port), "--backend-url", url]
    out: list[Measure] = []
    async with await anyio.open_process(server_cmd, stdout=None, stderr=None) as server:
        try:
            async with aiohttp.ClientSession() as http:
                with anyio.fail_after(120):
                    while True:
                        try:
                            async with http.get(f"{session_url}/health") as resp:
                                if resp.status == 200:
                                    break
                        except aiohttp.ClientConnectionError:
                            pass
                        if server.returncode is not None:
                            raise RuntimeError("miles' session server exited at start")
                        await anyio.sleep(0.5)
            server_cpu = psutil.Process(server.pid)
            for client, sessions in itertools.product(CHAT_CLIENTS, args.chat_sessions):
                cpu0 = sum(server_cpu.cpu_times()[:2])
                load = [python, str(HERE / "miles_peer" / "agent_load.py")]
                load += ["--session-url", session_url, "--tokenizer", tokenizer]
                load += ["--sessions", str(sessions), "--turns", str(args.chat_turns)]
                load += ["--max-tokens", str(args.chat_tokens), "--client", client]
                done = await anyio.run_process(load, stderr=None)
                r = json.loads(done.stdout.decode().strip().splitlines()[-1])
                cpu_s = r["cpu_s"] + sum(server_cpu.cpu_times()[:2]) - cpu0
                name = "miles" if client == "openai" else f"miles-{client}"
                m = Measure(
                    f"{name}@{sessions}", "", r["turns"], r["seconds"], r["output_tokens"], cpu_s
                )
                ordered = sorted(r["latencies_s"])
                m.extra = {
                    "turn_p50_ms": 1000 * ordered[len(ordered) // 2],
                    "assembly_ms_per_turn": 1000 * r["assembly_s"] / max(r["records"], 1),
                    "bad_masks": float(r["bad_masks"]),
                }
                if r["samples"] != sessions or r["records"] != sessions * args.chat_turns:
                    raise AssertionError(f"miles' peer run lost turns: {r}")
                out.append(m)
        finally:
            server.terminate()
            with anyio.move_on_after(10):
                await server.wait()
            if server.returncode is None:
                server.kill()
    return out


async def run_stop(url: str, inflight: int, n: int, tokenizer: Any) -> Measure:
    """Early stop with ``inflight`` requests held at the engine: stop -> nothing running."""

    async def quick_first(input: GenerateFnInput) -> Sample:
        # Group 0 answers at once, but only when all the others are held at the engine:
        # the stop then finds exactly `inflight` requests running there.
        if input.sample.group_index == 0:
            with anyio.fail_after(60):
                async with aiohttp.ClientSession() as http:
                    while True:
                        async with http.get(f"{url}/v1/loads") as resp:
                            loads = await resp.json()
                        if loads["loads"][0]["num_running_reqs"] >= inflight:
                            break
                        await anyio.sleep(0.01)
            input.sampling_params["max_new_tokens"] = 1
        return await single_turn(input)

    groups = token_groups(inflight + 4, 4, 16)
    config = TextRolloutConfig(
        n_samples_per_prompt=4,
        sampling=TextSamplingParams(max_new_tokens=n),
        rollout_batch_size=1,
        over_sampling_batch_size=len(groups),
        engines=engines(inflight + 4),
    )
    async with TextRollout.open(
        [url], tokenizer=tokenizer, config=config, generate=quick_first
    ) as rollout:
        async with probe(f"stop@{inflight}", "") as m:
            result = await rollout.run(groups)
        async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/loads") as resp:
            loads = await resp.json()
    aborted = sum(
        s.status is SampleStatus.ABORTED and s.response_length > 0
        for g in result.partial
        for s in g
    )
    m.requests = len(result.samples) + aborted
    m.extra = {
        "stop_to_idle_s": result.metrics.get("perf/stop_time", -1.0),
        "aborted_with_partial_output": float(aborted),
        "running_after": float(loads["loads"][0]["num_running_reqs"]),
    }
    return m


async def run_agents_out_rows(
    args: argparse.Namespace, zero_url: str, slow_url: str, tokenizer: Any
) -> list[Measure]:
    """The agents in a load child (:func:`run_agents_out`), against the session server in
    worker processes (``agents-out-procs``; unless ``--chat-processes 0``) and in-process
    (``agents-out``), on the zero-latency mock and on the latency mock (``-latency``: a
    saturated zero-latency engine makes any loop busy)."""
    out: list[Measure] = []
    setups = [("agents-out", 0)]
    if args.chat_processes != "0":
        setups.insert(0, ("agents-out-procs", _processes(args.chat_processes)))
    for sessions in args.agents_out_sessions:
        for engine, suffix in ((zero_url, ""), (slow_url, "-latency")):
            for name, processes in setups:
                mode = f"{name}{suffix}"
                out.append(
                    await run_agents_out(
                        engine,
                        sessions,
                        args.chat_turns,
                        args.chat_tokens,
                        tokenizer,
                        mode,
                        processes,
                    )
                )
    return out


async def run_all(
    args: argparse.Namespace, zero_url: str, slow_url: str, slow_chat_url: str
) -> list[Measure]:
    from miles_lite.testing import load_qwen3_tokenizer

    tokenizer = await anyio.to_thread.run_sync(load_qwen3_tokenizer)
    # What a tuned trainer does after its imports: a full collection of the heap that
    # torch, transformers and openai leave takes 0.15-0.3 s here, all of it a loop stall.
    # Both the layer and its baselines run in this process, under the same setting.
    gc.freeze()
    out: list[Measure] = []
    if args.agents_out_only:
        await run_chat(zero_url, 2, 2, args.chat_tokens, tokenizer, client="aiohttp")
        return await run_agents_out_rows(args, zero_url, slow_url, tokenizer)
    async with aiohttp.ClientSession() as http:
        for c in args.concurrency:
            requests = max(args.requests, c * 2)
            # Alternating pairs, the median pair reported with the range of all: one pair
            # moves by 5-10% from the next on these two cores (the mock shares them).
            pairs: list[tuple[Measure, Measure]] = []
            served_twice = 0
            for _ in range(args.generate_pairs):
                await mock_reset(http, zero_url)
                layer, _ = await layer_generate(
                    zero_url,
                    requests,
                    c,
                    args.output_tokens,
                    args.prompt_tokens,
                    f"generate@{c}",
                    tokenizer,
                )
                served_twice += (await mock_stats(http, zero_url))["served_twice"]
                bare, _ = await bare_generate(
                    zero_url, requests, c, args.output_tokens, args.prompt_tokens, f"bare@{c}"
                )
                pairs.append((layer, bare))
            layer, bare = median_run(pairs, lambda pair: pair)
            layer.baseline = bare.mode
            layer.extra["served_twice"] = float(served_twice)
            layer.extra["throughput_vs_bare"] = layer.rps / bare.rps
            out += [layer, bare]
        # Added latency: one wave of C requests held tokens x latency each (no queueing).
        c = args.latency_concurrency
        service = args.output_tokens * args.token_latency_ms / 1000
        layer, lat = await layer_generate(
            slow_url, c, c, args.output_tokens, args.prompt_tokens, f"latency@{c}", tokenizer
        )
        bare, bare_lat = await bare_generate(
            slow_url, c, c, args.output_tokens, args.prompt_tokens, f"latency-bare@{c}"
        )
        add_latency(layer, lat, service)
        add_latency(bare, bare_lat, service)
        layer.baseline = bare.mode
        out += [layer, bare]
        # Warm both chat paths first (lazy imports and caches): the first mode measured
        # would otherwise pay for them.
        for client in CHAT_CLIENTS:
            await run_chat(zero_url, 2, 2, args.chat_tokens, tokenizer, client=client)
        # The same for agent turns: C sessions, each turn held chat_tokens x latency.
        service = args.chat_tokens * args.token_latency_ms / 1000
        for client in CHAT_CLIENTS:
            mode = "chat-latency" if client == "openai" else f"chat-{client}-latency"
            chat = await run_chat(
                slow_url, c, args.chat_turns, args.chat_tokens, tokenizer, mode, client
            )
            add_latency(chat.layer, chat.layer_latencies, service)
            add_latency(chat.direct, chat.direct_latencies, service)
            for q in ("p50", "p99"):
                key = f"added_latency_{q}_ms"
                extra = chat.layer.extra
                extra[f"{key}_over_direct"] = extra[key] - chat.direct.extra[key]
            out += [chat.layer, chat.direct]
        # Agent turns with the openai client, then with a light aiohttp agent: with the
        # latter the session server, not the client, bounds the turns/s.
        chats = []
        for client in CHAT_CLIENTS:
            mode = "chat" if client == "openai" else f"chat-{client}"
            for sessions in args.chat_sessions:
                chat = await run_chat(
                    zero_url,
                    sessions,
                    args.chat_turns,
                    args.chat_tokens,
                    tokenizer,
                    mode,
                    client,
                    pairs=args.chat_pairs,
                    rounds=args.chat_rounds,
                )
                chats.append(chat.layer)
                out += [chat.layer, chat.direct]
        # The floor of those rows: the same agents through a proxy that does nothing.
        for sessions in args.chat_sessions:
            out += await run_proxy_floor(
                zero_url,
                sessions,
                args.chat_turns,
                args.chat_tokens,
                args.chat_pairs,
                args.chat_rounds,
            )
        # The light agent again, the session server in worker processes: what leaves the
        # rollout's process (its CPU per turn, its loop's lag), next to its own direct run.
        if args.chat_processes != "0":
            for sessions in args.chat_sessions:
                chat = await run_chat(
                    zero_url,
                    sessions,
                    args.chat_turns,
                    args.chat_tokens,
                    tokenizer,
                    "chat-aiohttp-procs",
                    "aiohttp",
                    processes=_processes(args.chat_processes),
                    pairs=args.chat_pairs,
                    rounds=args.chat_rounds,
                )
                out += [chat.layer, chat.direct]
        out += await run_agents_out_rows(args, zero_url, slow_url, tokenizer)
        if args.miles_peer:
            peers = await run_miles_peer(args, zero_url)
            for layer, peer in zip(chats, peers, strict=True):
                layer.extra["throughput_vs_miles"] = layer.rps / peer.rps
            out += peers
        # One long session: the light agent, so that the openai client's own per-call cost
        # (it re-validates the whole history each call) does not hide the layer's.
        for turns in args.turn_sweep:
            chat = await run_chat(zero_url, 1, turns, args.chat_tokens, tokenizer, client="aiohttp")
            layer = chat.layer
            layer.mode, layer.baseline = f"turns@{turns}", ""
            del layer.extra["throughput_vs_direct"]
            layer.extra["ms_per_turn"] = 1000 * layer.seconds / max(layer.requests, 1)
            out.append(layer)
        out.append(await run_stop(slow_chat_url, args.stop_inflight, args.stop_tokens, tokenizer))
    return out


def table(results: list[Measure]) -> str:
    lines = [
        "| mode | req/s | out tok/s | vs baseline | CPU ms/1k req | lag p50/p99/max ms | peak RSS MB | notes |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    by_mode = {m.mode: m for m in results}
    for m in results:
        base = by_mode.get(m.baseline)
        ratio = f"{m.rps / base.rps:.2f}x" if base and base.rps else "-"
        notes = ", ".join(
            f"{k}={v:.3g}"
            for k, v in m.extra.items()
            if k not in ("throughput_vs_bare", "throughput_vs_direct")
        )
        lines.append(
            f"| {m.mode} | {m.rps:.0f} | {m.tokens_per_s:.0f} | {ratio} | "
            f"{1e6 * m.cpu_s / max(m.requests, 1):.0f} | {m.lag(0.5):.2f} / {m.lag(0.99):.2f} / "
            f"{max(m.lags_ms, default=0):.1f} | {m.peak_rss_mb:.0f} | {notes} |"
        )
    return "\n".join(lines)


def chart(results: list[Measure], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_mode = {m.mode: m for m in results}
    pairs = [(m, by_mode[m.baseline]) for m in results if m.baseline in by_mode]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = list(range(len(pairs)))
    ax.bar([x - 0.27 for x in xs], [b.rps for _, b in pairs], width=0.27, label="baseline")
    ax.bar(xs, [m.rps for m, _ in pairs], width=0.27, label="miles_lite")
    peer = [
        (x, by_mode.get(m.mode.replace("chat", "miles", 1)))
        for x, (m, _) in enumerate(pairs)
        if m.mode.startswith(("chat@", "chat-aiohttp@"))
    ]
    peer = [(x, p) for x, p in peer if p is not None]
    if peer:
        ax.bar([x + 0.27 for x, _ in peer], [p.rps for _, p in peer], width=0.27, label="miles")
    ax.set_xticks(xs, [m.mode for m, _ in pairs], rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("requests (turns) / s, log scale")
    ax.set_title("text rollout layer vs its baseline and miles (same mock engine, same run)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, under a minute")
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument(
        "--generate-pairs",
        type=int,
        default=3,
        help="alternating generate@C / bare@C pairs; the median pair is reported",
    )
    parser.add_argument("--token-latency-ms", type=float, default=10.0)
    parser.add_argument("--latency-concurrency", type=int, default=64)
    parser.add_argument("--chat-sessions", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--chat-turns", type=int, default=8)
    parser.add_argument(
        "--chat-pairs",
        type=int,
        default=3,
        help="direct / session-server pairs of the zero-latency chat rows; the median pair"
        " is reported",
    )
    parser.add_argument(
        "--chat-rounds",
        type=int,
        default=1,
        help="sessions each agent of the zero-latency chat rows runs back to back: 1 (the"
        " default) measures a burst of C sessions; more, the sustained rate (the miles rows"
        " stay a burst)",
    )
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument(
        "--chat-processes",
        default="auto",
        help="worker processes of the session server for the chat-aiohttp-procs rows"
        " (SessionServerConfig.processes: a count or 'auto'; 0 skips those rows)",
    )
    parser.add_argument(
        "--agents-out-sessions",
        type=int,
        nargs="+",
        default=[256],
        help="agents in flight for the agents-out rows (agents in a load child process)",
    )
    parser.add_argument(
        "--agents-out-only",
        action="store_true",
        help="run only the agents-out rows (after a warm-up)",
    )
    parser.add_argument("--serve-agents", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--turn-sweep", type=int, nargs="+", default=[4, 32, 128])
    parser.add_argument("--stop-inflight", type=int, default=512)
    parser.add_argument("--stop-tokens", type=int, default=2000)
    parser.add_argument(
        "--png",
        type=Path,
        default=None,
        help="the chart (default: benchmarks/text_layer.png, the README's, for a full run;"
        " a file in the temp folder for --quick, which must not replace it)",
    )
    parser.add_argument(
        "--miles-peer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run miles' session server on the chat load (default: on, off with --quick);"
        " builds its venv with miles_peer/setup.sh on first use (a few minutes)",
    )
    parser.add_argument(
        "--miles-venv",
        type=Path,
        default=Path(
            os.environ.get(
                "MILES_LITE_MILES_VENV", Path.home() / ".cache/miles-lite/miles-peer-venv"
            )
        ),
    )
    args = parser.parse_args(argv)
    if args.chat_rounds < 1:
        parser.error(f"--chat-rounds must be at least 1, got {args.chat_rounds}")
    if args.serve_agents:  # the load child of the agents-out rows
        run_sync(serve_agents, args.chat_turns, args.chat_tokens)
        return 0
    if args.miles_peer is None:
        args.miles_peer = not args.quick
    if args.png is None:
        args.png = default_png(quick=args.quick)
    if args.quick:
        args.requests = 512
        args.generate_pairs = 1
        args.chat_pairs = 1
        args.concurrency = [1, 64, 512]
        args.chat_sessions = [1, 16]
        args.chat_turns = 4
        args.turn_sweep = [4, 32]
        args.stop_inflight = 128
        args.agents_out_sessions = [64]
    with (
        MockProcess(0.0, args.chat_tokens) as zero_url,
        MockProcess(args.token_latency_ms / 1000, args.chat_tokens) as slow_url,
        MockProcess(args.token_latency_ms / 1000, args.chat_tokens) as stop_url,
    ):
        results = run_sync(run_all, args, zero_url, slow_url, stop_url)
    print(table(results))
    print(json.dumps({"text_layer": [m.row() for m in results]}))
    chart(results, args.png)
    print(f"chart: {args.png}")
    return 0


def _processes(value: str) -> int | Literal["auto"]:
    """``--chat-processes``: a count, or ``auto``."""
    return "auto" if value == "auto" else int(value)


def default_png(*, quick: bool) -> Path:
    """Where the chart goes by default: the README's chart for a full run; a quick run's
    (smaller load, other numbers) goes to the temp folder, never over the README's."""
    if quick:
        return Path(tempfile.gettempdir()) / "miles-lite-text_layer-quick.png"
    return HERE / "text_layer.png"


if __name__ == "__main__":
    raise SystemExit(main())
