"""Generating through SGLang's router (smg), over MockTransport: what is leased, which
requests carry the sticky key, what is sent again, where aborts go. The real smg in front
of stand-in engines is the smg tier (tests/smg)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig, SmgConfig
from miles_lite.engine.control import abort_requests
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.mock import MockResponse, MockTransport
from miles_lite.engine.http.transport import Request
from miles_lite.engine.router import Router
from miles_lite.engine.smg import parse_workers, smg_launch_args
from miles_lite.errors import (
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineUnavailableError,
)
from tests.engine.test_router import wait_until

pytestmark = pytest.mark.anyio

SMG = "http://smg:30000"
ENGINES = ("http://e1:31001", "http://e2:31002")
FAST_RETRY = EngineClientConfig(
    retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0)
)


def worker(url: str, healthy: bool = True) -> dict[str, Any]:
    """One entry of smg 1.13's GET /workers (abridged to what miles_lite reads, plus some)."""
    return {
        "id": f"uuid-{url[-5:]}",
        "url": url,
        "model_id": "m",
        "is_healthy": healthy,
        "status": "ready" if healthy else "not_ready",
        "load": 0,
    }


class FakeSmg:
    """smg as the client sees it: its worker list, /readiness, and /generate answered by
    ``generate``; the engines' own endpoints at their URLs."""

    def __init__(self, generate: Callable[[Request], MockResponse] | None = None) -> None:
        self.workers = [worker(url) for url in ENGINES]
        self.ready = True
        self.generate = generate or (lambda request: MockResponse.json({"ok": True}))

    def __call__(self, request: Request) -> MockResponse:
        if request.url == SMG:
            if request.path == "/workers":
                return MockResponse.json({"workers": self.workers, "total": len(self.workers)})
            if request.path == "/readiness":
                return MockResponse(status=200 if self.ready else 503)
            if request.path in ("/generate", "/v1/chat/completions"):
                return self.generate(request)
            return MockResponse(status=404, headers={"x-smg-error-code": "unknown_url"})
        if request.path == "/abort_request":
            return MockResponse()
        if request.path.startswith("/v1/loads"):
            return MockResponse.json({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})
        return MockResponse(status=404)


def through_smg(**smg: Any) -> RouterConfig:
    return RouterConfig(
        max_inflight_per_engine=4,
        health_interval_s=60,
        failure_threshold=3,
        readmit_cooldown_s=0,
        smg=SmgConfig(**smg),
    )


def generations(transport: MockTransport) -> list[Request]:
    return [r for r in transport.requests if r.path == "/generate"]


async def test_generations_go_to_smg_and_control_targets_are_the_engines_it_lists() -> None:
    transport = MockTransport(FakeSmg())
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):
        assert router.front == SMG
        assert router.urls == ENGINES and router.healthy_urls == ENGINES
        # One lease queue: max_inflight_per_engine x the healthy engines listed.
        assert router.capacity == 8
        async with router.lease() as url:
            assert url == SMG
        assert await router.post_json("/generate", {"rid": "r1"}) == {"ok": True}
        stats = router.statistics()
    assert [g.url for g in generations(transport)] == [SMG]
    assert [w.url for w in stats.workers] == list(ENGINES)
    assert [e.url for e in stats.engines] == [SMG]


async def test_a_sticky_key_reaches_smg_as_a_header_and_goes_nowhere_else() -> None:
    transport = MockTransport(FakeSmg())
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):

        async def turn(url: str) -> None:
            await client.post_json(url, "/generate", {}, retry=False)
            # Inside the call, a request to an engine itself carries no key.
            await client.post_json(ENGINES[0], "/abort_request", {}, retry=False)

        async with anyio.create_task_group() as tg:
            for key in ("session-a", "session-b", "session-c"):
                tg.start_soon(lambda k=key: router.call(turn, key=k))
        await router.call(turn)  # no key: no header
        await client.post_json(SMG, "/generate", {}, retry=False)  # outside a call

    keys = [(r.headers or {}).get("X-SMG-Routing-Key") for r in generations(transport)]
    assert sorted(keys[:3]) == ["session-a", "session-b", "session-c"]
    assert keys[3:] == [None, None]
    aborts = [r for r in transport.requests if r.path == "/abort_request"]
    assert len(aborts) == 4 and all(not r.headers for r in aborts)


async def test_the_key_header_is_the_configured_one() -> None:
    transport = MockTransport(FakeSmg())
    config = through_smg(routing_key_header="X-Session-Id")
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, config) as router,
    ):
        await router.post_json("/generate", {}, key="s1")
    assert generations(transport)[0].headers == {"X-Session-Id": "s1"}


@pytest.mark.parametrize(
    ("status", "code", "sent"),
    [
        # smg says no engine got it: sent again.
        (500, "call_upstream_connection_failed", 3),
        (503, "no_available_workers", 3),
        (429, "admission_queue_full", 3),
        (503, "admission_queue_timeout", 3),
        # An engine may have generated it: never sent again, whatever the status.
        (500, "call_upstream_request_error", 1),
        (504, "call_upstream_timeout", 1),
        (502, "some_future_code", 1),
    ],
)
async def test_smg_error_codes_decide_what_is_sent_again(status: int, code: str, sent: int) -> None:
    body = {"error": {"type": "server_error", "code": code, "message": "m", "param": None}}
    answer = MockResponse.json(body, status=status)
    answer.headers["x-smg-error-code"] = code
    transport = MockTransport(FakeSmg(lambda request: answer))
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):
        with pytest.raises(EngineStatusError) as caught:
            await router.post_json("/generate", {"rid": "r1"}, request_id="r1")
    assert len(generations(transport)) == sent
    error = caught.value
    assert (error.status, error.url, error.request_id) == (status, SMG, "r1")
    assert code in str(error) and error.retryable == (sent == 3)
    assert ("no engine got the request" in str(error)) == (sent == 3)


async def test_an_engine_failing_behind_smg_is_named_and_does_not_take_smg_out() -> None:
    def busy(request: Request) -> MockResponse:
        return MockResponse(
            status=503, body=b"overloaded", headers={"x-smg-routed-worker-id": ENGINES[1]}
        )

    transport = MockTransport(FakeSmg(busy))
    no_retry = EngineClientConfig(retry=RetryPolicy(max_attempts=1))
    async with (
        EngineClient(no_retry, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):
        for _ in range(5):  # over failure_threshold
            with pytest.raises(EngineStatusError) as caught:
                await router.post_json("/generate", {})
            assert caught.value.url == ENGINES[1]
            assert f"engine {ENGINES[1]} (through SGLang's router at {SMG})" in str(caught.value)
        assert router.statistics().engines[0].healthy  # smg still in rotation


async def test_smg_with_no_engine_leaves_the_rotation_until_ready_again() -> None:
    fake = FakeSmg()
    answer = MockResponse(status=503, headers={"x-smg-error-code": "no_available_workers"})
    fake.generate = lambda request: answer
    transport = MockTransport(fake)
    no_retry = EngineClientConfig(retry=RetryPolicy(max_attempts=1))
    config = RouterConfig(
        max_inflight_per_engine=4,
        health_interval_s=0.02,
        failure_threshold=2,
        readmit_cooldown_s=0,
        wait_timeout_s=5,
        smg=SmgConfig(),
    )
    async with (
        EngineClient(no_retry, transport=transport) as client,
        Router([SMG], client, config) as router,
    ):
        fake.ready = False
        for _ in range(2):
            with pytest.raises(EngineStatusError):
                await router.post_json("/generate", {})
        assert not router.statistics().engines[0].healthy
        fake.generate = lambda request: MockResponse.json({"ok": True})
        fake.ready = True
        # The lease waits for /readiness to pass, then goes through.
        assert await router.post_json("/generate", {}) == {"ok": True}
        state = router.statistics().engines[0]
    assert (state.removals, state.readmissions) == (1, 1)


async def test_rids_sent_through_smg_are_aborted_at_every_engine_it_lists() -> None:
    transport = MockTransport(FakeSmg())
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):
        targets = router.abort_targets({SMG: ["r1", "r2"]})
        assert targets == {ENGINES[0]: ["r1", "r2"], ENGINES[1]: ["r1", "r2"]}
        report = await abort_requests(client, targets, timeout_s=1, settle_timeout_s=1)
        assert report.idle
        assert await router.abort_request(SMG, "r3", timeout_s=1)
        # A URL that is not the front is its own engine.
        assert router.engines_behind(ENGINES[0]) == (ENGINES[0],)
    aborts = [(r.url, r.body) for r in transport.requests if r.path == "/abort_request"]
    assert sorted(aborts) == sorted(
        [(e, b'{"rid":"%s"}' % rid) for e in ENGINES for rid in (b"r1", b"r2", b"r3")]
    )
    assert not [r for r in transport.requests if r.url == SMG and r.path == "/abort_request"]


async def test_the_worker_list_is_read_again_each_round_and_sets_the_bound() -> None:
    fake = FakeSmg()
    fake.workers = [worker(ENGINES[0])]
    transport = MockTransport(fake)
    config = RouterConfig(max_inflight_per_engine=4, health_interval_s=0.02, smg=SmgConfig())
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, config) as router,
    ):
        assert (router.urls, router.capacity) == (ENGINES[:1], 4)
        fake.workers = [worker(ENGINES[0]), worker(ENGINES[1]), worker("http://e3:1", False)]
        await wait_until(lambda: router.capacity == 8)
        assert router.urls == (*ENGINES, "http://e3:1")
        assert router.healthy_urls == ENGINES
        # A read that fails keeps the last list.
        fake.workers = [{"url": 3}]
        await wait_until(lambda: router.statistics().worker_refresh_failures > 0)
        assert router.urls == (*ENGINES, "http://e3:1")


async def test_opening_waits_for_min_workers_then_fails_saying_what_smg_listed() -> None:
    fake = FakeSmg()
    fake.workers = [worker(ENGINES[0]), worker(ENGINES[1], healthy=False)]
    transport = MockTransport(fake)
    config = through_smg(min_workers=2, open_timeout_s=0.3)
    async with EngineClient(FAST_RETRY, transport=transport) as client:
        with pytest.raises(EngineUnavailableError, match="2 healthy engine") as caught:
            async with Router([SMG], client, config):
                pass
    assert "not_ready" in str(caught.value) and caught.value.url == SMG
    assert not caught.value.retryable


async def test_opening_on_something_that_is_not_smg_fails_at_once() -> None:
    transport = MockTransport(lambda request: MockResponse.json({"status": "ok"}))
    async with EngineClient(FAST_RETRY, transport=transport) as client:
        with pytest.raises(EngineProtocolError, match="not a worker list"):
            async with Router([SMG], client, through_smg(open_timeout_s=30)):
                pass
    assert len(transport.requests) == 1


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ([], "not a worker list"),
        ({"workers": [7]}, r"workers\[0\] is 7"),
        ({"workers": [{**worker(ENGINES[0]), "is_healthy": "yes"}]}, r"is_healthy must be a bool"),
        ({"workers": [{**worker(ENGINES[0]), "url": "e1:31001"}]}, "http"),
        ({"workers": [worker(ENGINES[0]), worker(ENGINES[0])]}, "more than once"),
    ],
)
def test_a_worker_list_that_is_not_smgs_is_refused_naming_the_field(
    answer: Any, field: str
) -> None:
    with pytest.raises(EngineProtocolError, match=field) as caught:
        parse_workers(answer, SMG)
    assert caught.value.url == SMG


def test_smg_takes_one_url_and_a_header_name() -> None:
    with pytest.raises(ConfigError, match="exactly one URL"):
        Router(["http://a", "http://b"], EngineClient(), through_smg())
    with pytest.raises(ConfigError, match="routing_key_header"):
        SmgConfig(routing_key_header="X Key")
    with pytest.raises(ConfigError, match="min_workers"):
        SmgConfig(min_workers=0)
    with pytest.raises(ConfigError, match=r"RouterConfig\.smg"):
        RouterConfig(max_inflight_per_engine=1, smg="smg")  # type: ignore[arg-type]


def test_the_launch_arguments_carry_the_flags_miles_lite_relies_on() -> None:
    args = smg_launch_args(list(ENGINES), port=30100, prometheus_port=29100)
    assert args[0] == "launch"
    for flag in (
        "--disable-retries",
        "--disable-worker-overload-protection",
        "--worker-startup-check-interval",
    ):
        assert flag in args
    assert args[args.index("--policy") + 1] == "consistent_hashing"
    assert args[args.index("--worker-urls") + 1 : args.index("--worker-urls") + 3] == list(ENGINES)
    assert args[args.index("--port") + 1] == "30100"
    with pytest.raises(ConfigError):
        smg_launch_args("http://e1")


async def test_a_requests_own_headers_go_with_it_and_the_key_joins_them() -> None:
    transport = MockTransport(FakeSmg())
    async with (
        EngineClient(FAST_RETRY, transport=transport) as client,
        Router([SMG], client, through_smg()) as router,
    ):
        await client.post_json(ENGINES[0], "/abort_request", {}, headers={"X-Trace": "t1"})

        async def turn(url: str) -> None:
            await client.post_json(url, "/generate", {}, retry=False, headers={"X-Trace": "t2"})

        await router.call(turn, key="s1")
    aborts = [r for r in transport.requests if r.path == "/abort_request"]
    assert aborts[0].headers == {"X-Trace": "t1"}
    assert generations(transport)[0].headers == {"X-Trace": "t2", "X-SMG-Routing-Key": "s1"}
