"""A fast mock SGLang text engine for the text-layer benchmark, run in its own process.

It answers ``/generate`` and ``/v1/chat/completions`` from prebuilt answers (so it never
caps the measurement), in the captures' shape (compact JSON, as SGLang writes it), with
the ids and log-probs of a fixed ground truth (:func:`output_ids`,
:func:`output_log_prob`). ``token_latency_s`` > 0 holds
each request for ``max_new_tokens * token_latency_s``; ``/abort_request`` (rid or
``abort_all``) ends a held request at once with its partial output; ``/v1/loads`` reports
what is held. Chat prompts are "tokenized" by a toy append-only template (see
:func:`render`) that maps an assistant message back to the ids the mock generated for it,
as a real engine's template round-trips its own output; a chat body carrying
``input_ids`` (miles' session server sends its own TITO ids) uses those instead.

Why it is not the text stand-in (:mod:`miles_lite.testing.text`) in a fast mode: the
stand-in tokenizes with the real Qwen3 tokenizer, checks every key as SGLang does and
paces tokens through its scheduler, which is what makes it an oracle, and makes it the
bottleneck here: /generate of 64 tokens from 64 prompt ids, 64 concurrent requests from
one aiohttp client, answered 1415-1640 req/s by this mock against 631-720 by the
stand-in (3 runs each, 2 loaded cores). A fast mode in the stand-in would be this
module's prebuilt answers a second time, inside the oracle. The scale benchmark puts
smg in front of it, hence ``/version``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

IM_START, IM_END = 151644, 151645
ROLE_IDS = {"system": 8948, "user": 872, "assistant": 77091, "tool": 872}


def compact(value: Any) -> str:
    """JSON as SGLang writes its answers (orjson): no spaces."""
    return json.dumps(value, separators=(",", ":"))


def output_ids(n: int) -> list[int]:
    """The ground-truth output ids of an answer of ``n`` tokens (ends with IM_END)."""
    return [1000 + (i * 7) % 5000 for i in range(n - 1)] + [IM_END] if n > 0 else []


def output_log_prob(position: int) -> float:
    """The ground-truth log-prob of output ``position``."""
    return -0.125 - (position % 7) / 8


class MockEngine:
    """The mock's state; ``served`` counts every rid answered (a rid twice is a bug)."""

    def __init__(self, token_latency_s: float, chat_tokens: int) -> None:
        self.token_latency_s = token_latency_s
        self.chat_tokens = chat_tokens
        self.held: dict[str, asyncio.Event] = {}
        self.served: dict[str, int] = {}
        self.answer_ids: dict[str, list[int]] = {}  # chat content -> the ids generated for it
        self._bodies: dict[int, bytes] = {}
        self._chat_log_probs: dict[int, str] = {}

    def generate_body(self, n: int) -> bytes:
        body = self._bodies.get(n)
        if body is None:
            ids = output_ids(n)
            answer = {
                "text": "x" * n,
                "output_ids": ids,
                "meta_info": {
                    "id": "__RID__",
                    "finish_reason": {"type": "length", "length": n},
                    "prompt_tokens": 0,
                    "weight_version": "default",
                    "output_token_logprobs": [
                        [output_log_prob(i), t, None] for i, t in enumerate(ids)
                    ],
                    "completion_tokens": n,
                    "cached_tokens": 0,
                    "weight_versions": [{"version": "default", "start": 0, "end": n}],
                },
            }
            body = self._bodies[n] = compact(answer).encode()
        return body

    async def hold(self, rid: str, n: int) -> int:
        """Wait n tokens' worth of time (or until aborted); tokens made."""
        if self.token_latency_s <= 0 or n == 0:
            return n
        event = self.held[rid] = asyncio.Event()
        started = time.monotonic()
        try:
            await asyncio.wait_for(event.wait(), n * self.token_latency_s)
        except asyncio.TimeoutError:
            return n
        finally:
            self.held.pop(rid, None)
        return min(n, int((time.monotonic() - started) / self.token_latency_s))

    def count(self, rid: str) -> None:
        self.served[rid] = self.served.get(rid, 0) + 1

    async def generate(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        rid = body["rid"]
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        made = await self.hold(rid, n)
        self.count(rid)
        if made < n:
            ids = output_ids(n)[:made]
            answer = json.loads(self.generate_body(n))
            answer["output_ids"] = ids
            answer["meta_info"].update(
                id=rid,
                finish_reason={"type": "abort", "message": "Aborted"},
                completion_tokens=made,
                output_token_logprobs=answer["meta_info"]["output_token_logprobs"][:made],
            )
            return web.json_response(answer, dumps=compact)
        data = self.generate_body(n).replace(b"__RID__", rid.encode(), 1)
        return web.Response(body=data, content_type="application/json")

    def render(self, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """A toy append-only chat template over fake token ids."""
        ids: list[int] = []
        for message in messages:
            content = str(message.get("content") or "")
            own = self.answer_ids.get(content) if message.get("role") == "assistant" else None
            body = (
                own if own is not None else [2000 + ord(c) % 3000 for c in content[:256]] + [IM_END]
            )
            ids += [IM_START, ROLE_IDS.get(str(message.get("role")), 872), *body]
        if generation_prompt:
            ids += [IM_START, ROLE_IDS["assistant"]]
        return ids

    def chat_log_probs(self, n: int) -> str:
        """The JSON of an answer's ``logprobs`` for ``n`` output tokens when the request asks
        for log-probs, in SGLang's shape (each token's text, bytes and log-prob, and the
        one ``top_logprobs`` entry it lists even when none were asked for: about 150 bytes
        a token); prebuilt once per length, as the rest of the mock's answers."""
        text = self._chat_log_probs.get(n)
        if text is None:
            content = []
            for i, t in enumerate(output_ids(n)):
                token = {
                    "token": f"t{t}",
                    "bytes": list(f"t{t}".encode()),
                    "logprob": output_log_prob(i),
                }
                content.append({**token, "top_logprobs": [token]})
            text = self._chat_log_probs[n] = compact({"content": content})
        return text

    async def chat(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        rid = body.get("rid") or os.urandom(16).hex()
        n = int(body.get("max_tokens") or self.chat_tokens)
        # A session server doing its own TITO (miles') sends the prompt's ids.
        prompt = body.get("input_ids") or self.render(body["messages"], True)
        made = await self.hold(rid, n)
        self.count(rid)
        ids = output_ids(made)
        content = f"answer {len(self.answer_ids)}"
        self.answer_ids[content] = ids
        finish = "stop" if made == n else "abort"
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": IM_END if finish == "stop" else None,
        }
        if body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = prompt
        if body.get("return_meta_info"):
            choice["meta_info"] = {
                "id": rid,
                "finish_reason": {"type": "stop", "matched": IM_END}
                if finish == "stop"
                else {"type": "abort", "message": "Aborted"},
                "prompt_tokens": len(prompt),
                "weight_version": "default",
                "output_token_logprobs": [[output_log_prob(i), t, None] for i, t in enumerate(ids)],
                "completion_tokens": made,
            }
        answer = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": made,
                "total_tokens": len(prompt) + made,
            },
            "metadata": {"weight_version": "default", "weight_versions": []},
        }
        if not body.get("logprobs"):
            return web.json_response(answer, dumps=compact)
        # The prebuilt log-probs spliced in: encoding them again each answer would make
        # the mock, not the layer, what a session server's row measures.
        choice["logprobs"] = "@logprobs@"
        text = compact(answer).replace('"@logprobs@"', self.chat_log_probs(made), 1)
        return web.Response(text=text, content_type="application/json")

    async def abort(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        if body.get("abort_all"):
            for event in list(self.held.values()):
                event.set()
        elif isinstance(body.get("rid"), str):
            for rid, event in list(self.held.items()):
                if rid.startswith(body["rid"]):
                    event.set()
        return web.Response()

    async def loads(self, request: web.Request) -> web.Response:
        load = {"dp_rank": 0, "num_running_reqs": len(self.held), "num_waiting_reqs": 0}
        return web.json_response({"version": "mock", "loads": [load]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.5.23"})

    async def stats(self, request: web.Request) -> web.Response:
        twice = sum(1 for c in self.served.values() if c > 1)
        return web.json_response({"served": len(self.served), "served_twice": twice})

    async def reset(self, request: web.Request) -> web.Response:
        self.served.clear()
        self.answer_ids.clear()
        return web.Response()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 << 20)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_get("/health", lambda r: _ok())
        # smg registers an engine only if it answers one of /v1/models, /server_info,
        # /version (the scale benchmark puts smg in front of this mock).
        app.router.add_get("/version", self.version)
        app.router.add_get("/_mock/stats", self.stats)
        app.router.add_post("/_mock/reset", self.reset)
        return app


async def _ok() -> web.Response:
    return web.Response()


def _serve(port_out: Any, token_latency_s: float, chat_tokens: int) -> None:
    async def main() -> None:
        engine = MockEngine(token_latency_s, chat_tokens)
        runner = web.AppRunner(engine.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port_out.send(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


class MockProcess:
    """The mock in a child process (spawn): ``with MockProcess(...) as url: ...``."""

    def __init__(self, token_latency_s: float = 0.0, chat_tokens: int = 32) -> None:
        self.args = (token_latency_s, chat_tokens)
        self.process: multiprocessing.process.BaseProcess | None = None

    def __enter__(self) -> str:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, *self.args), daemon=True)
        self.process.start()
        if not parent.poll(60):
            raise RuntimeError("the mock engine did not start within 60 s")
        return f"http://127.0.0.1:{parent.recv()}"

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(10)
