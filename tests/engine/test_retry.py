"""RetryPolicy, retry_call and Router.call's loop: only retryable errors are retried, never
more than max_attempts."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_lite.engine.config import EngineClientConfig, RetryPolicy, RouterConfig
from miles_lite.engine.http._retry import retry_call
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.mock import MockResponse, MockTransport
from miles_lite.engine.router import Router
from miles_lite.errors import (
    ClosedResourceError,
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
)


def never_sent(error: MilesLiteError) -> MilesLiteError:
    """The error as the transport translator makes it when nothing reached the engine."""
    error.retryable = True
    return error


OUTCOMES: dict[str, Exception | None] = {
    "ok": None,
    "refused": never_sent(EngineUnavailableError("refused", url="u", request_id="r")),
    "timeout": never_sent(EngineTimeoutError("slow", url="u", request_id="r")),
    "reset": EngineUnavailableError("reset after sending", url="u", request_id="r"),
    "read timeout": EngineTimeoutError("no answer", url="u", request_id="r"),
    "503": EngineStatusError("busy", status=503, url="u", request_id="r"),
    "502": EngineStatusError("gateway", status=502, url="u", request_id="r"),
    "500": EngineStatusError("boom", status=500, url="u", request_id="r"),
    "400": EngineStatusError("bad", status=400, url="u", request_id="r"),
    "truncated": EngineProtocolError("truncated", url="u", request_id="r"),
    "closed": ClosedResourceError("closed"),
    "bug": KeyError("bug"),
}


@given(
    outcomes=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=1, max_size=8),
    max_attempts=st.integers(min_value=1, max_value=6),
)
def test_no_retry_of_a_non_retryable_error_and_attempts_never_exceed_max(
    outcomes: list[str], max_attempts: int
) -> None:
    policy = RetryPolicy(max_attempts=max_attempts, backoff_initial_s=0.0, backoff_max_s=0.0)
    calls: list[str] = []
    retries: list[int] = []

    async def attempt() -> str:
        name = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(name)
        error = OUTCOMES[name]
        if error is not None:
            raise error
        return name

    async def main() -> str | BaseException:
        try:
            return await retry_call(
                policy, attempt, rand=lambda: 0.5, on_retry=lambda k, e, d: retries.append(k)
            )
        except Exception as exc:
            return exc

    result = anyio.run(main)
    assert 1 <= len(calls) <= max_attempts
    assert retries == list(range(1, len(calls)))
    # Every attempt but the last failed with a retryable error.
    assert all(
        OUTCOMES[name] is not None and policy.should_retry(OUTCOMES[name]) for name in calls[:-1]
    )  # type: ignore[arg-type]
    last = OUTCOMES[calls[-1]]
    if last is None:
        assert result == "ok"
    else:
        assert result is last  # the last error, unchanged
        assert not policy.should_retry(last) or len(calls) == max_attempts


def test_retryable_is_read_from_the_error() -> None:
    retried = {
        name for name, e in OUTCOMES.items() if e is not None and RetryPolicy.should_retry(e)
    }
    assert retried == {"refused", "timeout", "503", "502"}


@given(
    initial=st.floats(0, 10),
    extra=st.floats(0, 100),
    jitter=st.floats(0, 1),
    retry=st.integers(1, 10_000),
    rand=st.floats(0, 1, exclude_max=True),
)
def test_backoff_is_bounded_and_grows(
    initial: float, extra: float, jitter: float, retry: int, rand: float
) -> None:
    policy = RetryPolicy(backoff_initial_s=initial, backoff_max_s=initial + extra, jitter=jitter)
    delay = policy.backoff_s(retry, rand)
    assert 0.0 <= delay <= policy.backoff_max_s
    no_jitter = RetryPolicy(backoff_initial_s=initial, backoff_max_s=initial + extra, jitter=0.0)
    assert no_jitter.backoff_s(retry, rand) <= no_jitter.backoff_s(retry + 1, rand)


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(backoff_initial_s=0.1, backoff_max_s=0.5, jitter=0.0)
    assert [policy.backoff_s(k, 0.9) for k in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.4, 0.5])


@pytest.mark.anyio
async def test_cancellation_during_backoff_is_not_retried() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise never_sent(EngineUnavailableError("refused"))

    policy = RetryPolicy(max_attempts=5, backoff_initial_s=10.0, backoff_max_s=10.0)
    with anyio.move_on_after(0.05) as scope:
        await retry_call(policy, attempt, rand=lambda: 0.5)
    assert scope.cancelled_caught
    assert calls == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", 2.0),
        ("backoff_initial_s", -1.0),
        ("backoff_max_s", float("nan")),
        ("jitter", 1.5),
    ],
)
def test_policy_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_policy_rejects_a_cap_below_the_initial_backoff() -> None:
    with pytest.raises(ConfigError, match="backoff_max_s"):
        RetryPolicy(backoff_initial_s=1.0, backoff_max_s=0.5)


def test_retry_delay_is_the_backoff_while_tries_remain_and_none_after() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_initial_s=0.1, backoff_max_s=1.0, jitter=0.0)
    refused = OUTCOMES["refused"]
    assert refused is not None
    draws: list[int] = []

    def rand() -> float:
        draws.append(1)
        return 0.5

    assert policy.retry_delay(1, refused, rand) == pytest.approx(0.1)
    assert policy.retry_delay(2, refused, rand) == pytest.approx(0.2)
    assert policy.retry_delay(3, refused, rand) is None  # max_attempts tries made
    for name in ("reset", "read timeout", "500", "truncated", "closed", "bug"):
        error = OUTCOMES[name]
        assert error is not None
        assert policy.retry_delay(1, error, rand) is None, name
    assert policy.retry_delay(1, asyncio.CancelledError(), rand) is None
    assert len(draws) == 2  # the jitter is drawn only when there is a next try


URLS = ["http://a:1", "http://b:2", "http://c:3"]


@given(
    outcomes=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=1, max_size=8),
    max_attempts=st.integers(min_value=1, max_value=6),
)
def test_router_call_retries_what_the_policy_allows_each_time_elsewhere(
    outcomes: list[str], max_attempts: int
) -> None:
    """Router.call's own loop keeps retry_call's rules: only retryable errors, at most
    max_attempts tries, each retry on an engine that has not failed this call while one
    is left, and every lease released (nothing left in flight) whatever the outcome."""
    policy = RetryPolicy(max_attempts=max_attempts, backoff_initial_s=0.0, backoff_max_s=0.0)
    config = RouterConfig(max_inflight_per_engine=1, health_interval_s=60.0, failure_threshold=100)
    tried: list[str] = []

    async def fn(url: str) -> str:
        name = outcomes[min(len(tried), len(outcomes) - 1)]
        tried.append(url)
        error = OUTCOMES[name]
        if error is not None:
            raise error
        return name

    async def main() -> str | BaseException:
        transport = MockTransport(lambda request: MockResponse())  # /health answers 200
        async with (
            EngineClient(EngineClientConfig(), transport=transport) as client,
            Router(URLS, client, config) as router,
        ):
            try:
                return await router.call(fn, policy=policy)
            except Exception as exc:
                return exc
            finally:
                assert [router.in_flight(url) for url in URLS] == [0, 0, 0]

    result = anyio.run(main)
    assert 1 <= len(tried) <= max_attempts
    names = [outcomes[min(i, len(outcomes) - 1)] for i in range(len(tried))]
    for i, name in enumerate(names[:-1]):
        error = OUTCOMES[name]
        assert error is not None and policy.should_retry(error)
        if i + 1 < len(URLS):
            assert tried[i + 1] not in tried[: i + 1]  # an engine that has not failed yet
    last = OUTCOMES[names[-1]]
    if last is None:
        assert result == "ok"
    else:
        assert result is last
        assert not policy.should_retry(last) or len(tried) == max_attempts
