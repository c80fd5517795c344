"""The miles side of the benchmark's peer rows, run in the peer venv: agents driving chat
turns through miles' session server, then miles' own client-side sample assembly, as its
``agentic_tool_call`` generate function does (tracer, records, per-turn samples, merge).

    $VENV/bin/python benchmarks/miles_peer/agent_load.py --session-url URL --tokenizer DIR \
        --sessions 64 --turns 8 --max-tokens 32

The load is the one ``text_layer.py`` runs through miles_lite: each agent sends the same
messages with the same client (``--client``: the ``openai`` client, or a light aiohttp
agent posting the same JSON). Prints one JSON line: turns, seconds, CPU seconds,
output tokens, turn latencies, assembly time, records and samples made, and how many
samples' loss masks do not match their response length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from miles.rollout.generate_utils.openai_endpoint_utils import (
    OpenAIEndpointTracer,
    compute_samples_from_openai_records,
)
from miles.rollout.generate_utils.sample_utils import merge_samples
from miles.utils.http_utils import init_http_client
from miles.utils.types import Sample
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chat_agents import chat_client


async def agent(
    args: SimpleNamespace,
    tokenizer: Any,
    for_session: Any,
    a: argparse.Namespace,
    out: dict[str, Any],
) -> None:
    tracer = await OpenAIEndpointTracer.create(args)
    send = for_session(f"{tracer.base_url}/v1", "-")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Solve the task."}]
    try:
        for turn in range(a.turns):
            t0 = time.perf_counter()
            content, tokens = await send(messages, a.max_tokens)
            out["latencies_s"].append(time.perf_counter() - t0)
            out["turns"] += 1
            out["output_tokens"] += tokens
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "tool", "content": f"result {turn}"})
    finally:
        records, metadata = await tracer.collect_records()
    t0 = time.perf_counter()
    samples = compute_samples_from_openai_records(
        args,
        Sample(prompt=messages[:1]),
        records,
        tokenizer,
        accumulated_token_ids=metadata.get("accumulated_token_ids"),
        max_trim_tokens=metadata.get("max_trim_tokens", 0),
    )
    sample = merge_samples(samples, tokenizer)
    out["assembly_s"] += time.perf_counter() - t0
    out["samples"] += 1
    out["records"] += len(records)
    out["bad_masks"] += int(len(sample.loss_mask) != sample.response_length)


async def run(a: argparse.Namespace) -> dict[str, Any]:
    host, port = a.session_url.removeprefix("http://").rsplit(":", 1)
    args = SimpleNamespace(
        session_server_ip=host,
        session_server_port=int(port),
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_server_concurrency=max(a.sessions, 64),
        use_distributed_post=False,
        use_rollout_routing_replay=False,
    )
    init_http_client(args)
    tokenizer = AutoTokenizer.from_pretrained(a.tokenizer)
    out: dict[str, Any] = dict(
        turns=0,
        output_tokens=0,
        latencies_s=[],
        assembly_s=0.0,
        samples=0,
        records=0,
        bad_masks=0,
    )
    async with chat_client(a.client) as for_session:
        cpu0, t0 = time.process_time(), time.perf_counter()
        agents = (agent(args, tokenizer, for_session, a, out) for _ in range(a.sessions))
        await asyncio.gather(*agents)
        out["seconds"] = time.perf_counter() - t0
        out["cpu_s"] = time.process_time() - cpu0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session-url", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--client", choices=["openai", "aiohttp"], default="openai")
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
