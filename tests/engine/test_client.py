"""EngineClient against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import anyio
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http._body import read_all_chunks
from miles_lite.engine.http._errors import Progress
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.http.response import FreshBuffer, allocate_fresh
from miles_lite.errors import (
    ArenaError,
    BodyTooLargeError,
    ClosedResourceError,
    ConfigError,
    EngineProtocolError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tests.support.engine_fakes import RawEngine, RawHandler, Reply, ScriptedEngine

StartRaw = Callable[[RawHandler], Awaitable[RawEngine]]

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.002)


def config(**overrides: object) -> EngineClientConfig:
    fields: dict[str, object] = {"retry": FAST_RETRY, "total_timeout_s": 10.0}
    fields.update(overrides)
    return EngineClientConfig(**fields)  # type: ignore[arg-type]


class RecordingAllocator:
    """Hands out bytearrays with some slack, and remembers what was asked."""

    def __init__(self, slack: int = 16) -> None:
        self.sizes: list[int] = []
        self.buffers: list[FreshBuffer] = []
        self.slack = slack

    async def __call__(self, nbytes: int) -> FreshBuffer:
        self.sizes.append(nbytes)
        buffer = FreshBuffer(bytearray(nbytes + self.slack))
        self.buffers.append(buffer)
        return buffer


def pattern(nbytes: int) -> bytes:
    return (bytes(range(251)) * (nbytes // 251 + 1))[:nbytes]


# -- reading bodies --------------------------------------------------------------------


@pytest.mark.anyio
async def test_body_is_read_into_the_provided_buffer(engine: ScriptedEngine) -> None:
    body = pattern(300_000)
    engine.script("/rollout/generate", Reply(body=body, content_type="application/msgpack"))
    into = RecordingAllocator()
    async with EngineClient(config(read_chunk_bytes=4096)) as client:
        raw = await client.post(
            engine.url,
            "/rollout/generate",
            {"seed": 7, "prompt": "a cat"},
            request_id="r1",
            into=into,
        )
    assert into.sizes == [len(body)]
    assert raw.owner is into.buffers[0]
    assert raw.body == body
    assert raw.body.obj is into.buffers[0].data  # a view of the buffer, not a copy
    assert (raw.status, raw.content_type, raw.url, raw.request_id) == (
        200,
        "application/msgpack",
        engine.url,
        "r1",
    )
    seen = engine.seen[0]
    assert json.loads(seen.body) == {"seed": 7, "prompt": "a cat"}
    assert seen.headers["Content-Type"] == "application/json"
    assert client.statistics().bytes_received == len(body)


@pytest.mark.anyio
async def test_big_body_is_read_without_blocking_the_loop(engine: ScriptedEngine) -> None:
    # The loop guard (conftest) fails the test if any loop step takes over 0.25 s.
    nbytes = 64 << 20
    # The server writes 1 MiB pieces so that its own send does not stall the shared loop.
    engine.script("/rollout/generate", Reply(body=bytes(nbytes), pieces=64))
    async with EngineClient(config()) as client:
        raw = await client.post(engine.url, "/rollout/generate", {"seed": 1})
        assert raw.nbytes == nbytes
        assert client.statistics().bytes_received == nbytes


@pytest.mark.anyio
async def test_default_buffer_does_not_touch_its_pages_up_front() -> None:
    # bytearray(n) would zero (and fault in) all n bytes in one step on the loop.
    process = psutil.Process()
    before = process.memory_info().rss
    buffer = await allocate_fresh(512 << 20)
    assert process.memory_info().rss - before < 64 << 20
    assert len(buffer.view) == 512 << 20 and not buffer.view.readonly
    small = await allocate_fresh(10)
    assert isinstance(small.data, bytearray) and len(small.view) == 10


class _BufferedStream:
    """A stand-in for aiohttp's StreamReader holding a whole body, recording read sizes."""

    def __init__(self, body: bytes) -> None:
        self.body = memoryview(body)
        self.asked: list[int] = []

    async def read(self, n: int = -1) -> bytes:
        self.asked.append(n)
        chunk, self.body = (
            self.body[: n if n >= 0 else None],
            self.body[len(self.body) if n < 0 else n :],
        )
        return bytes(chunk)


@pytest.mark.anyio
async def test_bodies_without_length_are_read_in_bounded_pieces_never_whole() -> None:
    body = pattern(10_000)
    stream = _BufferedStream(body)
    progress = Progress()
    chunks = await read_all_chunks(stream, 1024, 1 << 20, progress, url=None, request_id=None)  # type: ignore[arg-type]
    assert b"".join(chunks) == body and 0 < max(stream.asked) <= 1024


@pytest.mark.anyio
@pytest.mark.parametrize("nbytes", [1000, 3 << 20], ids=["small", "over-1MiB"])
async def test_body_without_content_length_is_gathered_then_copied(
    engine: ScriptedEngine, nbytes: int
) -> None:
    body = pattern(nbytes)
    engine.script("/generate", Reply(body=body, pieces=7, chunked=True))
    into = RecordingAllocator()
    async with EngineClient(config(read_chunk_bytes=64 << 10)) as client:
        raw = await client.post(engine.url, "/generate", {}, into=into)
    assert into.sizes == [nbytes]
    assert raw.body == body


@pytest.mark.anyio
async def test_empty_body_gives_an_empty_view_without_allocating(engine: ScriptedEngine) -> None:
    engine.script("/abort_request", Reply(body=b""))
    into = RecordingAllocator()
    async with EngineClient(config()) as client:
        raw = await client.post(engine.url, "/abort_request", {"rid": "x"}, into=into)
    assert (raw.nbytes, raw.owner, into.sizes) == (0, None, [])


@pytest.mark.anyio
async def test_content_length_over_the_limit_is_refused_unread(engine: ScriptedEngine) -> None:
    engine.script("/rollout/generate", Reply(body=bytes(2 << 20)))
    into = RecordingAllocator()
    async with EngineClient(config(max_body_bytes=1 << 20)) as client:
        with pytest.raises(BodyTooLargeError) as caught:
            await client.post(engine.url, "/rollout/generate", {}, request_id="big", into=into)
        assert client.statistics().bytes_received == 0
        assert client.statistics().attempts == 1
    assert into.sizes == []
    err = caught.value
    assert (err.url, err.request_id) == (engine.url, "big")
    assert str(2 << 20) in str(err) and "max_body_bytes" in str(err)


@pytest.mark.anyio
async def test_body_without_length_over_the_limit_is_refused_while_reading(
    engine: ScriptedEngine,
) -> None:
    engine.script("/generate", Reply(body=bytes(3 << 20), pieces=12, chunked=True))
    into = RecordingAllocator()
    async with EngineClient(config(max_body_bytes=1 << 20, read_chunk_bytes=64 << 10)) as client:
        with pytest.raises(BodyTooLargeError, match="without Content-Length"):
            await client.post(engine.url, "/generate", {}, into=into)
        assert client.statistics().bytes_received <= (1 << 20) + (64 << 10)
    assert into.sizes == []


async def _truncated_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: 1000\r\n\r\n"
    )
    writer.write(b"x" * 400)
    await writer.drain()


@pytest.mark.anyio
async def test_truncated_body_raises_protocol_error_and_is_not_retried(
    raw_engine: StartRaw,
) -> None:
    raw = await raw_engine(_truncated_answer)
    async with EngineClient(config()) as client:
        with pytest.raises(EngineProtocolError) as caught:
            await client.post(raw.url, "/rollout/generate", {}, request_id="rid-7")
    err = caught.value
    assert type(err) is EngineProtocolError
    assert "truncated body: got 400 of 1000 bytes" in str(err)
    assert raw.url in str(err) and "rid-7" in str(err)
    assert (err.url, err.request_id) == (raw.url, "rid-7")
    assert raw.connections == 1


@pytest.mark.anyio
async def test_compressed_answer_is_refused(engine: ScriptedEngine) -> None:
    engine.script("/generate", Reply(body=b"\x1f\x8b...", headers=(("Content-Encoding", "gzip"),)))
    async with EngineClient(config()) as client:
        with pytest.raises(EngineProtocolError, match="Content-Encoding 'gzip'"):
            await client.post(engine.url, "/generate", {})
    assert engine.seen[0].headers["Accept-Encoding"] == "identity"


# -- status codes and retries ------------------------------------------------------------


@pytest.mark.anyio
async def test_500_is_not_retried(engine: ScriptedEngine) -> None:
    detail = b'{"detail": "CUDA out of memory"}' + b"." * 2000
    engine.script("/rollout/generate", Reply(500, detail, "application/json"))
    async with EngineClient(config()) as client:
        with pytest.raises(EngineStatusError) as caught:
            await client.post(engine.url, "/rollout/generate", {"seed": 3}, request_id="r500")
        assert (
            client.statistics().attempts,
            client.statistics().retries,
            client.statistics().failures,
        ) == (1, 0, 1)
    err = caught.value
    assert engine.count("/rollout/generate") == 1
    assert (err.status, err.retryable, err.url, err.request_id) == (500, False, engine.url, "r500")
    assert err.body_excerpt.startswith('{"detail": "CUDA out of memory"}')
    assert len(err.body_excerpt) <= 512
    assert "HTTP 500" in str(err) and "r500" in str(err)


@pytest.mark.anyio
async def test_503_503_200_succeeds_after_two_retries(engine: ScriptedEngine) -> None:
    engine.script("/rollout/generate", Reply(503, b"warming up"), Reply(503), Reply(body=b"ok"))
    async with EngineClient(config()) as client:
        raw = await client.post(engine.url, "/rollout/generate", {"seed": 1})
        stats = client.statistics()
    assert raw.body == b"ok"
    assert engine.count("/rollout/generate") == 3
    assert (stats.requests, stats.attempts, stats.retries, stats.failures) == (1, 3, 2, 0)


@pytest.mark.anyio
async def test_connection_refused_raises_unavailable_after_max_attempts(refused_url: str) -> None:
    async with EngineClient(config()) as client:
        with pytest.raises(EngineUnavailableError) as caught:
            await client.post(refused_url, "/generate", {}, request_id="r-refused")
        assert (client.statistics().attempts, client.statistics().retries) == (3, 2)
    assert (caught.value.url, caught.value.request_id) == (refused_url, "r-refused")
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.anyio
async def test_read_timeout_raises_timeout_error_and_is_never_resent(
    engine: ScriptedEngine,
) -> None:
    # The request reached the engine, which may be generating: a retry would run the
    # generation twice (miles issue 1378). It fails with the reason instead.
    slow = Reply(body=b"late", delay_s=0.5)
    engine.script("/generate", slow, slow)
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)
    async with EngineClient(config(read_timeout_s=0.05, retry=retry)) as client:
        with pytest.raises(EngineTimeoutError, match="read_timeout_s") as caught:
            await client.post(engine.url, "/generate", {}, request_id="slow")
    assert engine.count("/generate") == 1
    assert caught.value.request_id == "slow" and not caught.value.retryable


@pytest.mark.anyio
async def test_a_reset_after_the_request_was_sent_is_never_resent(raw_engine: StartRaw) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # the request was read in full: drop without answering

    raw = await raw_engine(reset)
    retry = RetryPolicy(max_attempts=3, backoff_initial_s=0.001, backoff_max_s=0.001)
    async with EngineClient(config(retry=retry)) as client:
        with pytest.raises(EngineUnavailableError, match="after the request was sent") as caught:
            await client.post(raw.url, "/generate", {"text": "x"}, request_id="r-reset")
    assert raw.connections == 1
    assert caught.value.request_id == "r-reset" and not caught.value.retryable


@pytest.mark.anyio
async def test_total_timeout_raises_timeout_error(engine: ScriptedEngine) -> None:
    engine.script("/generate", Reply(body=b"late", delay_s=0.5))
    retry = RetryPolicy(max_attempts=1)
    async with EngineClient(
        config(read_timeout_s=None, total_timeout_s=0.05, retry=retry)
    ) as client:
        with pytest.raises(EngineTimeoutError, match="total timeout"):
            await client.post(engine.url, "/generate", {})


@pytest.mark.anyio
async def test_timeout_override_applies_to_one_call(engine: ScriptedEngine) -> None:
    engine.script("/generate", Reply(body=b"late", delay_s=0.3), Reply(body=b"fast"))
    async with EngineClient(config(retry=RetryPolicy(max_attempts=1))) as client:
        with pytest.raises(EngineTimeoutError):
            await client.post(engine.url, "/generate", {}, timeout_s=0.05)
        assert (await client.post(engine.url, "/generate", {})).body == b"fast"


@pytest.mark.anyio
async def test_allocator_errors_pass_through_untranslated_and_unretried(
    engine: ScriptedEngine,
) -> None:
    engine.script("/generate", Reply(body=b"abc"))

    async def no_room(nbytes: int) -> FreshBuffer:
        raise TimeoutError("arena full")

    async with EngineClient(config()) as client:
        with pytest.raises(TimeoutError, match="arena full") as caught:
            await client.post(engine.url, "/generate", {}, into=no_room)
    assert not isinstance(caught.value, EngineTimeoutError)
    assert engine.count("/generate") == 1


@pytest.mark.anyio
async def test_too_small_buffer_from_the_allocator_is_an_arena_error(
    engine: ScriptedEngine,
) -> None:
    engine.script("/generate", Reply(body=b"abcdef"))

    async def small(nbytes: int) -> FreshBuffer:
        return FreshBuffer(bytearray(2))

    async with EngineClient(config()) as client:
        with pytest.raises(ArenaError, match="2 bytes for a body of 6 bytes"):
            await client.post(engine.url, "/generate", {}, into=small)


@pytest.mark.anyio
async def test_cancelled_post_leaves_the_client_usable(engine: ScriptedEngine) -> None:
    engine.script("/generate", Reply(body=b"late", delay_s=0.3), Reply(body=b"next"))
    async with EngineClient(config()) as client:
        with anyio.move_on_after(0.05) as scope:
            await client.post(engine.url, "/generate", {})
        assert scope.cancelled_caught
        assert client.statistics().retries == 0
        assert (await client.post(engine.url, "/generate", {})).body == b"next"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    statuses=st.lists(
        st.sampled_from([200, 400, 404, 422, 500, 502, 503, 504]), min_size=1, max_size=5
    ),
    max_attempts=st.integers(min_value=1, max_value=4),
)
@pytest.mark.anyio
async def test_only_retryable_statuses_are_retried_and_attempts_are_bounded(
    engine: ScriptedEngine, statuses: list[int], max_attempts: int
) -> None:
    engine.queues.clear()
    engine.seen.clear()
    engine.script("/x", *(Reply(status, b"s%d" % status) for status in statuses))
    engine.defaults["/x"] = Reply(200, b"default")
    expected_attempts = 0
    for status in [*statuses, 200][:max_attempts]:
        expected_attempts += 1
        if status not in (502, 503, 504):
            break
    retry = RetryPolicy(max_attempts=max_attempts, backoff_initial_s=0.0, backoff_max_s=0.0)
    async with EngineClient(config(retry=retry)) as client:
        try:
            await client.post(engine.url, "/x", {}, request_id="p")
            outcome = 200
        except EngineStatusError as err:
            outcome = err.status
            assert (err.url, err.request_id) == (engine.url, "p")
    assert engine.count("/x") == expected_attempts <= max_attempts
    assert outcome == [*statuses, 200][expected_attempts - 1]


# -- control endpoints -----------------------------------------------------------------


@pytest.mark.anyio
async def test_json_control_endpoints(engine: ScriptedEngine) -> None:
    engine.script(
        "/model_info", Reply(body=b'{"weight_version": "step-7"}', content_type="application/json")
    )
    engine.script("/abort_request", Reply(body=b""))
    engine.script("/flush_cache", Reply(body=b"Cache flushed.", content_type="text/plain"))
    async with EngineClient(config()) as client:
        assert await client.get_json(engine.url, "/model_info") == {"weight_version": "step-7"}
        assert await client.post_json(engine.url, "/abort_request", {"rid": "abc"}) is None
        with pytest.raises(EngineProtocolError, match="not JSON"):
            await client.post_json(engine.url, "/flush_cache")
    assert json.loads(engine.seen[1].body) == {"rid": "abc"}
    assert engine.seen[2].body == b""


@pytest.mark.anyio
async def test_json_bodies_nan_refused_before_sending_and_nan_answers_still_read(
    engine: ScriptedEngine,
) -> None:
    # A NaN or infinity in a payload is not JSON and SGLang refuses it: refused here.
    engine.script("/x", Reply(body=b'{"logprob": NaN, "ids": [1, 2], "none": null}'))
    async with EngineClient(config()) as client:
        for bad in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match="JSON compliant"):
                await client.post_json(engine.url, "/x", {"temperature": bad, "stop": None})
        assert engine.count("/x") == 0
        # None is null, not a refusal; an answer with NaN (Python's json writes it) is read.
        answer = await client.post_json(engine.url, "/x", {"stop": None, "ids": [1, 2]})
    assert answer["ids"] == [1, 2] and answer["none"] is None
    assert answer["logprob"] != answer["logprob"]  # NaN
    assert json.loads(engine.seen[0].body) == {"stop": None, "ids": [1, 2]}


@pytest.mark.anyio
async def test_health(engine: ScriptedEngine, refused_url: str) -> None:
    engine.script("/health", Reply(200), Reply(503))
    async with EngineClient(config()) as client:
        assert await client.health(engine.url) is True
        assert await client.health(engine.url) is False
        assert await client.health(refused_url) is False
        assert client.statistics().retries == 0


# -- lifecycle and configuration ---------------------------------------------------------


@pytest.mark.anyio
async def test_use_outside_the_open_state_is_refused(engine: ScriptedEngine) -> None:
    client = EngineClient(config())
    with pytest.raises(ClosedResourceError, match="not open"):
        await client.post(engine.url, "/health", {})
    async with client:
        assert (await client.post(engine.url, "/health", {})).status == 200
    await client.aclose()  # idempotent
    assert client.closed
    with pytest.raises(ClosedResourceError, match="closed") as caught:
        await client.post(engine.url, "/generate", {}, request_id="late")
    assert (caught.value.url, caught.value.request_id) == (engine.url, "late")
    with pytest.raises(ClosedResourceError):
        await client.health(engine.url)
    with pytest.raises(ClosedResourceError):
        async with client:
            pass


@pytest.mark.anyio
async def test_invalid_url_is_a_config_error() -> None:
    async with EngineClient(config()) as client:
        with pytest.raises(ConfigError, match="invalid engine URL"):
            await client.post("not a url", "/generate", {})
        assert client.statistics().retries == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("connect_timeout_s", 0),
        ("connect_timeout_s", None),
        ("read_timeout_s", -1.0),
        ("total_timeout_s", float("inf")),
        ("max_connections", 0),
        ("max_connections_per_host", 10_000),
        ("max_body_bytes", 1.5),
        ("read_chunk_bytes", True),
        ("retry", 3),
        ("headers", {"Authorization": "x"}),
        ("headers", (("Authorization", 1),)),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        EngineClientConfig(**{field: value})  # type: ignore[arg-type]


def test_config_refuses_an_unbounded_request() -> None:
    EngineClientConfig(total_timeout_s=None)  # bounded by the read timeout
    with pytest.raises(ConfigError, match="total_timeout_s"):
        EngineClientConfig(total_timeout_s=None, read_timeout_s=None)


@pytest.mark.anyio
async def test_timeout_objects_are_made_once_per_bound_and_stay_bounded(
    engine: ScriptedEngine,
) -> None:
    """aiohttp's timeout object is made once per set of bounds (not per request), and
    callers passing ever new ``timeout_s`` values do not grow the cache without bound."""
    async with EngineClient(EngineClientConfig()) as client:
        for _ in range(5):
            await client.get_json(engine.url, "/health")
        cache = client._transport._timeouts  # type: ignore[attr-defined]
        assert len(cache) == 1
        for i in range(100):
            assert await client.health(engine.url, timeout_s=1.0 + i / 1000)
        assert 1 <= len(cache) <= 64
