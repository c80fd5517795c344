"""A remote reward scorer: the engine layer's client posting batches of samples to a scoring API."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio

from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineClientConfig
from miles_lite.engine.retry import RetryPolicy
from miles_lite.errors import (
    BodyTooLargeError,
    ClosedResourceError,
    ConfigError,
    EngineError,
    EngineStatusError,
    EngineTimeoutError,
    EngineUnavailableError,
    MilesLiteError,
    RewardError,
)

if TYPE_CHECKING:
    from miles_lite.types import Sample

__all__ = ["ApiScorer", "ApiScorerStatistics", "decode_scores", "encode_samples"]

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

    One :class:`~miles_lite.engine.EngineClient` (connections ``max_concurrency``, total
    timeout ``timeout_s`` seconds, connect timeout ``connect_timeout_s``, ``headers`` on
    every request), so its transport errors and its retry policy are the engines': what
    never reached the server (refused, DNS, connect timeout) and 502/503/504 answers are
    retried up to ``max_retries`` times, after ``retry_backoff_s * 2**attempt`` seconds; the
    call keeps its slot meanwhile. Nothing else is retried: a timeout or a reset once the
    request is sent, another status, a malformed answer. Every 2xx is accepted. Usage::

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
        # The engine layer's client: one transport-error translation and one retry policy.
        parts = urlsplit(url)
        self._base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        self._path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._client = EngineClient(
            EngineClientConfig(
                connect_timeout_s=connect_timeout_s,
                read_timeout_s=None,
                total_timeout_s=timeout_s,
                max_connections=max_concurrency,
                max_connections_per_host=max_concurrency,
                max_body_bytes=max_response_bytes,
                retry=RetryPolicy(
                    max_attempts=max_retries + 1,
                    backoff_initial_s=retry_backoff_s,
                    backoff_max_s=retry_backoff_s * 2 ** min(max_retries, 30),
                    jitter=0.0,
                ),
                headers=tuple((str(k), str(v)) for k, v in (headers or {}).items()),
            )
        )
        self._retries_before = 0
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
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self._client.aclose()

    def stats(self) -> ApiScorerStatistics:
        """A snapshot of the queue-depth and retry counters (see :class:`ApiScorerStatistics`)."""
        return ApiScorerStatistics(
            calls=self._calls,
            max_queue_depth=self._max_depth,
            max_waiting=self._max_waiting,
            in_flight=self._in_flight,
            waiting=self._outstanding - self._in_flight,
            retries=self._client.stats.retries - self._retries_before,
            failures=self._failures,
        )

    def reset_stats(self) -> None:
        """Zero the counters (``calls``, maxima, ``retries``, ``failures``), e.g. per rollout."""
        self._calls = 0
        self._max_depth = 0
        self._max_waiting = 0
        self._retries_before = self._client.stats.retries if hasattr(self, "_client") else 0
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
        client = self._open()

        self._calls += 1
        self._max_depth = max(self._max_depth, self._outstanding)
        self._outstanding += 1
        self._max_waiting = max(self._max_waiting, self._outstanding - self.max_concurrency)
        try:
            try:
                payload = self._encode(samples)
            except (TypeError, ValueError) as exc:
                raise RewardError(
                    f"reward API request for {where} could not be encoded ({exc!r})", url=self.url
                ) from exc
            async with self._limiter:
                self._in_flight += 1
                try:
                    answer = await self._post(client, payload, where)
                finally:
                    self._in_flight -= 1
            return self._scores(answer, samples, where)
        except RewardError:
            self._failures += 1
            raise
        finally:
            self._outstanding -= 1

    def _open(self) -> EngineClient:
        if self._closed:
            raise ClosedResourceError(f"ApiScorer for {self.url} is closed; make a new one")
        return self._client

    async def _post(self, client: EngineClient, payload: Any, where: str) -> Any:
        """One POST under the engine layer's retry policy; returns the parsed JSON answer.

        The client retries only what never reached the server and 502/503/504: a scoring
        request the server received is never sent twice.
        """
        retries = self.max_retries
        try:
            raw = await client.post(self._base, self._path, payload)
        except ClosedResourceError as exc:
            raise ClosedResourceError(
                f"ApiScorer for {self.url} was closed during a call for {where}"
            ) from exc
        except (TypeError, ValueError) as exc:
            if isinstance(exc, MilesLiteError):
                raise
            raise RewardError(
                f"reward API request for {where} is not JSON-serializable ({exc}); pass encode= "
                "to ApiScorer to build a JSON body",
                url=self.url,
            ) from exc
        except EngineStatusError as exc:
            after = f" after {retries} retries" if exc.retryable and retries else ""
            raise RewardError(
                f"reward API answered HTTP {exc.status} for {where}{after}: {exc.body_excerpt!r}",
                url=self.url,
            ) from exc
        except EngineUnavailableError as exc:
            raise RewardError(
                f"reward API unreachable for {where} after {retries} retries: {exc}",
                url=self.url,
            ) from exc
        except EngineTimeoutError as exc:
            raise RewardError(
                f"reward API gave no answer for {where} within timeout_s={self.timeout_s} s "
                f"(not retried: the request may be running): {exc}",
                url=self.url,
            ) from exc
        except BodyTooLargeError as exc:
            raise RewardError(
                f"reward API answer for {where} exceeds max_response_bytes="
                f"{self.max_response_bytes}: {exc}",
                url=self.url,
            ) from exc
        except EngineError as exc:
            raise RewardError(
                f"reward API request for {where} failed: {exc}", url=self.url
            ) from exc
        return _parse_json(raw.body.tobytes(), self.url, where)

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
