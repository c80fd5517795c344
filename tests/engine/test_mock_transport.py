"""The client and the router over MockTransport: no server, the same error translation."""

from __future__ import annotations

import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http._errors import Failure
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.mock import MockFailure, MockResponse, MockTransport
from miles_lite.engine.http.transport import Request
from miles_lite.engine.router import Router
from miles_lite.errors import EngineProtocolError, EngineTimeoutError

pytestmark = pytest.mark.anyio

FAST_RETRY = EngineClientConfig(
    retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0)
)


async def test_a_503_is_retried_then_the_answer_is_read() -> None:
    answers = iter([MockResponse(status=503, body=b"busy"), MockResponse.json({"ok": True})])
    transport = MockTransport(lambda request: next(answers))
    async with EngineClient(FAST_RETRY, transport=transport) as client:
        assert await client.post_json("http://e", "/generate", {"x": 1}) == {"ok": True}
        stats = client.statistics()
    assert (stats.attempts, stats.retries, stats.failures) == (2, 1, 0)
    assert [r.path for r in transport.requests] == ["/generate", "/generate"]
    assert transport.requests[0].body == b'{"x":1}'


@pytest.mark.parametrize(
    ("failure", "sent"),
    [(Failure.UNREACHABLE, 3), (Failure.CONNECT_TIMEOUT, 3), (Failure.READ_TIMEOUT, 1)],
)
async def test_only_what_never_reached_the_engine_is_tried_again(
    failure: Failure, sent: int
) -> None:
    def handler(request: Request) -> MockResponse:
        raise MockFailure(failure)

    transport = MockTransport(handler)
    async with EngineClient(FAST_RETRY, transport=transport) as client:
        with pytest.raises(Exception) as caught:
            await client.post("http://e", "/generate", {}, request_id="rid-1")
    assert caught.value.request_id == "rid-1"  # type: ignore[attr-defined]
    assert len(transport.requests) == sent


async def test_a_body_cut_short_is_a_protocol_error_naming_the_bytes() -> None:
    transport = MockTransport(lambda request: MockResponse(body=b"x" * 100, fail_after=40))
    async with EngineClient(FAST_RETRY, transport=transport) as client:
        with pytest.raises(EngineProtocolError, match="got 40 of 100 bytes"):
            await client.post("http://e", "/generate", {})
    assert len(transport.requests) == 1  # received, so never sent again


async def test_the_router_sends_a_never_sent_request_to_the_other_engine() -> None:
    def handler(request: Request) -> MockResponse:
        if request.path == "/health":
            return MockResponse()
        if request.url == "http://a":
            raise MockFailure(Failure.UNREACHABLE)
        return MockResponse.json({"engine": request.url})

    transport = MockTransport(handler)
    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=60, failure_threshold=10)
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router(["http://a", "http://b"], client, config) as router,
    ):
        for _ in range(4):
            assert await router.post_json("/generate", {}) == {"engine": "http://b"}
    generations = [r for r in transport.requests if r.path == "/generate"]
    assert sum(r.url == "http://b" for r in generations) == 4


async def test_a_timeout_after_sending_is_not_sent_again_by_the_router() -> None:
    def handler(request: Request) -> MockResponse:
        if request.path == "/health":
            return MockResponse()
        raise MockFailure(Failure.READ_TIMEOUT)

    transport = MockTransport(handler)
    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=60)
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router(["http://a", "http://b"], client, config) as router,
    ):
        with pytest.raises(EngineTimeoutError) as caught:
            await router.post_json("/generate", {})
    assert caught.value.retryable is False
    assert sum(r.path == "/generate" for r in transport.requests) == 1
