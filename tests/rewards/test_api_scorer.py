"""ApiScorer against a real aiohttp server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from aiohttp import web

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.errors import ClosedResourceError, ConfigError, RewardError
from miles_lite.rewards.api_scorer import DEFAULT_CLIENT, ApiScorer, ApiScorerStatistics
from miles_lite.types import Sample

pytestmark = pytest.mark.anyio


class ScoreServer:
    """A scoring API that counts requests in flight and plays a script of statuses."""

    def __init__(
        self,
        *,
        statuses: list[int] | None = None,
        delay_s: float = 0.0,
        answer: Callable[[dict[str, Any]], Any] | None = None,
        raw: bytes | None = None,
    ) -> None:
        self.statuses = list(statuses or [])
        self.delay_s = delay_s
        self.answer = answer or (
            lambda body: {"scores": [s["index"] / 10 for s in body["samples"]]}
        )
        self.raw = raw
        self.hits = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.bodies.append(body)
            if self.delay_s:
                await anyio.sleep(self.delay_s)
            if self.statuses:
                status = self.statuses.pop(0)
                if status != 200:
                    return web.Response(status=status, text=f"scripted {status}")
            if self.raw is not None:
                return web.Response(body=self.raw, content_type="application/json")
            return web.json_response(self.answer(body))
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def serve(server: ScoreServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/score", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/score"
    finally:
        await runner.cleanup()


def client(*, retries: int = 2, **fields: Any) -> EngineClientConfig:
    """The default client config with ``retries`` immediate retries and other ``fields``."""
    return dataclasses.replace(
        DEFAULT_CLIENT,
        retry=RetryPolicy(max_attempts=retries + 1, backoff_initial_s=0.0, backoff_max_s=0.0),
        **fields,
    )


def samples(*indices: int) -> list[Sample]:
    return [
        Sample(index=i, prompt=f"prompt {i}", response=f"answer {i}", label=i % 2) for i in indices
    ]


async def test_scores_come_back_in_sample_order_with_the_default_schema() -> None:
    server = ScoreServer()
    async with serve(server) as url, ApiScorer(url) as scorer:
        scores = await scorer.score(samples(4, 1, 7))
    assert scores == [0.4, 0.1, 0.7]
    assert all(isinstance(s, float) for s in scores)
    (body,) = server.bodies
    assert body["samples"][0] == {
        "index": 4,
        "group_index": 0,
        "prompt": "prompt 4",
        "response": "answer 4",
        "label": 0,
        "metadata": {},
    }


async def test_dict_scores_pass_through() -> None:
    server = ScoreServer(
        answer=lambda body: {"scores": [{"acc": 1.0, "fmt": 0.5} for _ in body["samples"]]}
    )
    async with serve(server) as url, ApiScorer(url) as scorer:
        assert await scorer.score(samples(0, 1)) == [{"acc": 1.0, "fmt": 0.5}] * 2


async def test_never_more_than_max_concurrency_requests_in_flight() -> None:
    server = ScoreServer(delay_s=0.05)
    results: dict[int, list[float | dict[str, Any]]] = {}
    async with serve(server) as url, ApiScorer(url, max_concurrency=3) as scorer:

        async def one(i: int) -> None:
            results[i] = await scorer.score(samples(i))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        stats = scorer.statistics()
    assert server.max_in_flight == 3
    assert results == {i: [i / 10] for i in range(12)}
    assert stats == ApiScorerStatistics(
        calls=12, max_queue_depth=11, max_waiting=9, in_flight=0, waiting=0, retries=0, failures=0
    )
    assert stats.max_queue_depth >= 3  # at or above max_concurrency: some calls waited


async def test_calls_one_after_another_never_queue() -> None:
    server = ScoreServer()
    async with serve(server) as url, ApiScorer(url, max_concurrency=2) as scorer:
        for i in range(3):
            await scorer.score(samples(i))
        stats = scorer.statistics()
    assert (stats.calls, stats.max_queue_depth, stats.max_waiting) == (3, 0, 0)


@pytest.mark.parametrize("status", [400, 404, 500])
async def test_an_error_status_is_a_reward_error_naming_url_and_samples(status: int) -> None:
    server = ScoreServer(statuses=[status])
    async with serve(server) as url, ApiScorer(url, client=client()) as scorer:
        with pytest.raises(RewardError) as info:
            await scorer.score(samples(3, 4))
        assert scorer.statistics().failures == 1
    assert server.hits == 1  # not retried
    assert info.value.url == url
    assert url in str(info.value)
    assert f"HTTP {status}" in str(info.value)
    assert "samples [3, 4]" in str(info.value)
    assert f"scripted {status}" in str(info.value)


async def test_503_is_retried_then_succeeds() -> None:
    server = ScoreServer(statuses=[503, 503, 200])
    async with serve(server) as url, ApiScorer(url, client=client(retries=2)) as scorer:
        assert await scorer.score(samples(5)) == [0.5]
        assert scorer.statistics().retries == 2
    assert server.hits == 3


async def test_503_retries_are_bounded() -> None:
    server = ScoreServer(statuses=[503] * 10)
    async with serve(server) as url, ApiScorer(url, client=client(retries=2)) as scorer:
        with pytest.raises(RewardError, match=r"HTTP 503 .*after 2 retries") as info:
            await scorer.score(samples(0))
    assert server.hits == 3
    assert info.value.url == url


async def test_a_refused_connection_is_retried_then_a_reward_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    async with ApiScorer(url, client=client(retries=1)) as scorer:
        with pytest.raises(RewardError, match="unreachable") as info:
            await scorer.score(samples(2))
        assert scorer.statistics().retries == 1
    assert info.value.url == url


async def test_a_timeout_is_not_retried() -> None:
    server = ScoreServer(delay_s=0.5)
    async with (
        serve(server) as url,
        ApiScorer(url, client=client(retries=3, total_timeout_s=0.1)) as scorer,
    ):
        with pytest.raises(RewardError, match="within its timeout"):
            await scorer.score(samples(0))
    assert server.hits == 1


@pytest.mark.parametrize(
    ("server", "needle"),
    [
        (ScoreServer(raw=b"{not json"), "not JSON"),
        (ScoreServer(answer=lambda body: {"scores": [1.0]}), "returned 1 scores for 2 samples"),
        (ScoreServer(answer=lambda body: {"rewards": [1.0, 2.0]}), "wrong shape"),
        (ScoreServer(answer=lambda body: {"scores": "high"}), "wrong shape"),
        (ScoreServer(answer=lambda body: {"scores": [1.0, "high"]}), "sample 1 is 'high'"),
        (ScoreServer(answer=lambda body: {"scores": [1.0, True]}), "sample 1 is True"),
        (ScoreServer(raw=b'{"scores": [1.0, NaN]}'), "sample 1 is nan"),
    ],
)
async def test_a_malformed_answer_is_a_reward_error(server: ScoreServer, needle: str) -> None:
    async with serve(server) as url, ApiScorer(url) as scorer:
        with pytest.raises(RewardError, match=needle) as info:
            await scorer.score(samples(0, 1))
    assert server.hits == 1
    assert info.value.url == url


async def test_an_answer_over_the_size_limit_is_refused() -> None:
    server = ScoreServer(answer=lambda body: {"scores": [0.0], "padding": "x" * 5000})
    async with serve(server) as url, ApiScorer(url, client=client(max_body_bytes=1000)) as scorer:
        with pytest.raises(RewardError, match="max_body_bytes=1000"):
            await scorer.score(samples(0))


async def test_custom_encode_and_decode_speak_another_schema() -> None:
    def encode(batch: list[Sample]) -> dict[str, Any]:
        return {"prompts": [s.prompt for s in batch], "responses": [s.response for s in batch]}

    def decode(body: Any) -> list[Any]:
        return [item["score"] for item in body["results"]]

    server = ScoreServer(
        answer=lambda body: {"results": [{"score": len(r)} for r in body["responses"]]}
    )
    async with serve(server) as url, ApiScorer(url, encode=encode, decode=decode) as scorer:
        assert await scorer.score(samples(1, 22)) == [8.0, 9.0]
    assert server.bodies == [
        {"prompts": ["prompt 1", "prompt 22"], "responses": ["answer 1", "answer 22"]}
    ]


async def test_unserializable_samples_fail_before_any_request() -> None:
    server = ScoreServer()
    bad = samples(6)
    bad[0].metadata["blob"] = object()
    async with serve(server) as url, ApiScorer(url) as scorer:
        with pytest.raises(RewardError, match=r"samples \[6\] is not JSON-serializable"):
            await scorer.score(bad)
        assert await scorer.score([]) == []
    assert server.hits == 0


async def test_a_closed_scorer_refuses_calls() -> None:
    server = ScoreServer()
    async with serve(server) as url:
        scorer = ApiScorer(url)
        with pytest.raises(ClosedResourceError, match="not open"):
            await scorer.score(samples(0))
        async with scorer:
            await scorer.score(samples(0))
        await scorer.aclose()  # idempotent
        with pytest.raises(ClosedResourceError, match="closed"):
            await scorer.score(samples(0))
        with pytest.raises(ClosedResourceError):
            async with scorer:
                pass


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "rm:8000/score"}, "url"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"client": {"total_timeout_s": 1}}, "client"),
    ],
)
def test_bad_options_raise_config_error(kwargs: dict[str, Any], field: str) -> None:
    options: dict[str, Any] = {"url": "http://127.0.0.1:1/score", **kwargs}
    with pytest.raises(ConfigError, match=field):
        ApiScorer(**options)


def test_the_default_request_is_json() -> None:
    from miles_lite.rewards.api_scorer import decode_scores, encode_samples

    body = encode_samples(samples(0))
    assert json.loads(json.dumps(body)) == body
    assert decode_scores({"scores": [1, 2]}) == [1, 2]


async def test_a_cancelled_call_frees_its_slot() -> None:
    server = ScoreServer(delay_s=0.3)
    async with serve(server) as url, ApiScorer(url, max_concurrency=1) as scorer:
        with anyio.move_on_after(0.05):
            async with anyio.create_task_group() as tg:
                tg.start_soon(scorer.score, samples(0))
                tg.start_soon(scorer.score, samples(1))  # waits for the slot
        stats = scorer.statistics()
        assert (stats.in_flight, stats.waiting, stats.max_waiting) == (0, 0, 1)
        server.delay_s = 0.0
        assert await scorer.score(samples(2)) == [0.2]


async def test_headers_query_and_any_2xx_reach_and_come_back() -> None:
    seen: list[tuple[str | None, str]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.headers.get("Authorization"), request.query_string))
        return web.json_response({"scores": [1.0] * len(body["samples"])}, status=201)

    app = web.Application()
    app.router.add_post("/v1/score", handle)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/score?model=rm"
    try:
        async with ApiScorer(
            url, client=client(headers=(("Authorization", "Bearer t0k"),))
        ) as scorer:
            assert await scorer.score(samples(1, 2)) == [1.0, 1.0]
    finally:
        await runner.cleanup()
    assert seen == [("Bearer t0k", "model=rm")]


async def test_a_connection_reset_after_sending_is_not_retried() -> None:
    """The server read the request (it may be scoring it): sending it again is not safe."""
    connections = 0

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()  # RST, no answer

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/score"
    try:
        async with ApiScorer(url, client=client(retries=3)) as scorer:
            with pytest.raises(RewardError) as info:
                await scorer.score(samples(4))
            assert scorer.statistics().retries == 0
    finally:
        server.close()
        await server.wait_closed()
    assert connections == 1
    assert info.value.url == url
    assert "samples [4]" in str(info.value)
