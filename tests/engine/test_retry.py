"""RetryPolicy and retry_call: only retryable errors are retried, never more than max_attempts."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_lite.engine._retry import retry_call
from miles_lite.engine.config import RetryPolicy
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
