"""A remote reward scorer: one aiohttp client posting batches of samples to a scoring API."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp
import anyio

from miles_lite.errors import RETRYABLE_STATUSES, ClosedResourceError, ConfigError, RewardError

if TYPE_CHECKING:
    from miles_lite.types import Sample

__all__ = ["ApiScorer", "ApiScorerStatistics", "decode_scores", "encode_samples"]

#: A connect-phase timeout: nothing reached the server, so a retry is safe (aiohttp >= 3.10).
_CONNECT_TIMEOUT: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(aiohttp, "ConnectionTimeoutError", None),) if t is not None
)
_EXCERPT_BYTES = 300


def encode_samples(samples: list[Sample]) -> dict[str, Any]:
    """The default request body: ``{"samples": [{"index", "group_index", "prompt",
    "response", "label", "metadata"}, ...]}``, one entry per sample, in order.

    ``prompt`` is a string or a list of chat messages, ``response`` the generated text,
    ``label`` and ``metadata`` as on the sample: they must be JSON-serializable (pass your
    own ``encode=`` to :class:`ApiScorer` otherwise).
    """
    return {
        "samples": [
            {
                "index": s.index,
                "group_index": s.group_index,
                "prompt": s.prompt,
                "response": s.response,
                "label": s.label,
                "metadata": s.metadata,
            }
            for s in samples
        ]
    }


def decode_scores(body: Any) -> list[Any]:
    """The default response reader: ``{"scores": [...]}`` -> the list, one per sample.

    Each score is a number or an object (a dict of named scores). Raises ``KeyError`` /
    ``TypeError`` on another shape; :class:`ApiScorer` turns that into ``RewardError``.
    """
    if not isinstance(body, dict):
        raise TypeError(f"expected a JSON object with a 'scores' list, got {type(body).__name__}")
    scores = body["scores"]
    if not isinstance(scores, list):
        raise TypeError(f"'scores' must be a list, got {type(scores).__name__}")
    return scores


@dataclass(frozen=True, slots=True)
class ApiScorerStatistics:
    """What an :class:`ApiScorer` did since it was made or since :meth:`ApiScorer.reset_stats`.

    ``max_queue_depth``: at each call, how many calls were already in flight (sending or
    waiting for a slot); the maximum. Below ``max_concurrency`` means no call ever waited.
    ``max_waiting``: the most calls waiting for a slot at once. ``in_flight``/``waiting``:
    now. ``retries``: HTTP attempts repeated after a 502/503/504 or a connection error.
    ``failures``: calls that raised ``RewardError``.
    """

    calls: int
    max_queue_depth: int
    max_waiting: int
    in_flight: int
    waiting: int
    retries: int
    failures: int


class ApiScorer:
    """Score samples with a remote HTTP API, at most ``max_concurrency`` requests at once.

    Each :meth:`score` call is one ``POST url`` with a JSON body (``encode(samples)``,
    :func:`encode_samples` by default: ``{"samples": [{"index", "prompt", "response",
    ...}]}``) whose JSON answer ``decode`` turns into one score per sample
    (:func:`decode_scores` by default: ``{"scores": [0.5, {"acc": 1.0}, ...]}``). Scores are
    numbers (returned as float) or dicts. ``encode``/``decode`` run on the event loop: keep
    them cheap.

    One ``aiohttp.ClientSession`` (connector limit ``max_concurrency``, total timeout
    ``timeout_s`` seconds, connect timeout ``connect_timeout_s``), opened on first use.
    A 502/503/504 answer or a connection error (refused, reset, connect timeout) is retried
    up to ``max_retries`` times, after ``retry_backoff_s * 2**attempt`` seconds; the call
    keeps its slot meanwhile. Nothing else is retried: a timeout once the request is sent,
    another status, a malformed answer. Usage::

        async with ApiScorer("http://rm:8000/score", max_concurrency=16) as scorer:
            scores = await scorer.score(samples)

    Raises ``ConfigError`` on a bad option.
    """

    def __init__(
        self,
        url: str,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        max_response_bytes: int = 8 * 1024 * 1024,
        headers: Mapping[str, str] | None = None,
        encode: Callable[[list[Sample]], Any] = encode_samples,
        decode: Callable[[Any], list[Any]] = decode_scores,
    ) -> None:
        """Record the options; the HTTP session opens on first use (inside the event loop)."""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"ApiScorer url must start with http:// or https://, got {url!r}")
        for name, value in (
            ("max_concurrency", max_concurrency),
            ("max_response_bytes", max_response_bytes),
        ):
            if value < 1:
                raise ConfigError(f"ApiScorer {name} must be >= 1, got {value!r}")
        for name, number in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not number > 0:
                raise ConfigError(f"ApiScorer {name} must be > 0 seconds, got {number!r}")
        if max_retries < 0 or retry_backoff_s < 0:
            raise ConfigError(
                f"ApiScorer max_retries and retry_backoff_s must be >= 0, got {max_retries!r}, {retry_backoff_s!r}"
            )
        self.url = url
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.max_response_bytes = max_response_bytes
        self.headers = dict(headers or {})
        self._encode = encode
        self._decode = decode
        self._session: aiohttp.ClientSession | None = None
        self._limiter = anyio.Semaphore(max_concurrency)
        self._closed = False
        self._outstanding = 0
        self._in_flight = 0
        self.reset_stats()

    async def __aenter__(self) -> ApiScorer:
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session; idempotent. Later calls raise ``ClosedResourceError``.

        Shielded from cancellation and bounded (5 s). Calls still in flight fail.
        """
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await session.close()

    def stats(self) -> ApiScorerStatistics:
        """A snapshot of the queue-depth and retry counters (see :class:`ApiScorerStatistics`)."""
        return ApiScorerStatistics(
            calls=self._calls,
            max_queue_depth=self._max_depth,
            max_waiting=self._max_waiting,
            in_flight=self._in_flight,
            waiting=self._outstanding - self._in_flight,
            retries=self._retries,
            failures=self._failures,
        )

    def reset_stats(self) -> None:
        """Zero the counters (``calls``, maxima, ``retries``, ``failures``), e.g. per rollout."""
        self._calls = 0
        self._max_depth = 0
        self._max_waiting = 0
        self._retries = 0
        self._failures = 0

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """POST ``samples`` and return one score per sample, in order.

        Waits for a slot when ``max_concurrency`` calls are in flight. Raises
        ``RewardError`` (with ``url``, naming the sample indices) on an HTTP error status,
        a connection error or timeout (after the retries), a body over
        ``max_response_bytes``, malformed JSON, or a wrong number or type of scores;
        ``ClosedResourceError`` after :meth:`aclose`. On cancellation the request is
        abandoned (its connection closed) and the slot freed.
        """
        if self._closed:
            raise ClosedResourceError(f"ApiScorer for {self.url} is closed; make a new one")
        if not samples:
            return []
        where = _indices(samples)
        try:
            body = json.dumps(self._encode(samples)).encode()
        except (TypeError, ValueError) as exc:
            self._failures += 1
            raise RewardError(
                f"reward API request for {where} is not JSON-serializable ({exc}); pass encode= "
                "to ApiScorer to build a JSON body",
                url=self.url,
            ) from exc
        session = self._open()

        self._calls += 1
        self._max_depth = max(self._max_depth, self._outstanding)
        self._outstanding += 1
        self._max_waiting = max(self._max_waiting, self._outstanding - self.max_concurrency)
        try:
            async with self._limiter:
                self._in_flight += 1
                try:
                    answer = await self._post(session, body, where)
                finally:
                    self._in_flight -= 1
            return self._scores(answer, samples, where)
        except RewardError:
            self._failures += 1
            raise
        finally:
            self._outstanding -= 1

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClosedResourceError(f"ApiScorer for {self.url} is closed; make a new one")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_concurrency, limit_per_host=self.max_concurrency
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=self.connect_timeout_s),
                headers=self.headers,
            )
        return self._session

    async def _post(self, session: aiohttp.ClientSession, body: bytes, where: str) -> Any:
        """One POST with the bounded retries; returns the parsed JSON answer."""
        attempt = 0
        while True:
            if self._closed:
                raise ClosedResourceError(
                    f"ApiScorer for {self.url} was closed during a call for {where}"
                )
            try:
                async with session.post(
                    self.url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    if resp.status in RETRYABLE_STATUSES and attempt < self.max_retries:
                        failure = f"HTTP {resp.status}"
                    elif resp.status >= 300:
                        excerpt = (await resp.content.read(_EXCERPT_BYTES)).decode(errors="replace")
                        raise RewardError(
                            f"reward API answered HTTP {resp.status} for {where}"
                            f"{' after ' + str(attempt) + ' retries' if attempt else ''}: {excerpt!r}",
                            url=self.url,
                        )
                    else:
                        return _parse_json(await self._read(resp, where), self.url, where)
            except _CONNECT_TIMEOUT as exc:
                failure = f"connect timeout ({exc!r})"
            except (asyncio.TimeoutError, TimeoutError) as exc:
                raise RewardError(
                    f"reward API gave no answer for {where} within timeout_s={self.timeout_s} s "
                    "(not retried: the request may be running)",
                    url=self.url,
                ) from exc
            except aiohttp.ClientConnectionError as exc:
                if attempt >= self.max_retries:
                    raise RewardError(
                        f"reward API unreachable for {where} after {attempt} retries: {exc!r}",
                        url=self.url,
                    ) from exc
                failure = repr(exc)
            except aiohttp.ClientError as exc:
                raise RewardError(
                    f"reward API request for {where} failed: {exc!r}", url=self.url
                ) from exc
            if attempt >= self.max_retries:
                raise RewardError(
                    f"reward API failed for {where} after {attempt} retries: {failure}",
                    url=self.url,
                )
            await anyio.sleep(self.retry_backoff_s * 2**attempt)
            attempt += 1
            self._retries += 1

    async def _read(self, resp: aiohttp.ClientResponse, where: str) -> bytes:
        limit = self.max_response_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise RewardError(
                f"reward API answer for {where} is {resp.content_length} bytes, over max_response_bytes={limit}",
                url=self.url,
            )
        buf = bytearray()
        async for chunk in resp.content.iter_chunked(64 * 1024):
            buf += chunk
            if len(buf) > limit:
                raise RewardError(
                    f"reward API answer for {where} exceeds max_response_bytes={limit}",
                    url=self.url,
                )
        return bytes(buf)

    def _scores(
        self, answer: Any, samples: list[Sample], where: str
    ) -> list[float | dict[str, Any]]:
        try:
            scores = self._decode(answer)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RewardError(
                f"reward API answer for {where} has the wrong shape: {exc!r}", url=self.url
            ) from exc
        if not isinstance(scores, list) or len(scores) != len(samples):
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise RewardError(
                f"reward API returned {got} scores for {len(samples)} samples ({where})",
                url=self.url,
            )
        out: list[float | dict[str, Any]] = []
        for sample, value in zip(samples, scores, strict=True):
            if isinstance(value, dict):
                out.append(value)
            elif (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                out.append(float(value))
            else:
                raise RewardError(
                    f"reward API score for sample {sample.index} is {value!r}; expected a finite number "
                    "or an object",
                    url=self.url,
                )
        return out


def _parse_json(raw: bytes, url: str, where: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        excerpt = raw[:_EXCERPT_BYTES].decode(errors="replace")
        raise RewardError(
            f"reward API answer for {where} is not JSON ({exc}): {excerpt!r}", url=url
        ) from exc


def _indices(samples: list[Sample]) -> str:
    shown = [s.index for s in samples[:8]]
    more = f" ... ({len(samples)} in all)" if len(samples) > 8 else ""
    return f"samples {shown}{more}"
