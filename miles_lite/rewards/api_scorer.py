"""A remote reward scorer: the engine layer's client posting batches of samples to a scoring API."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio

from miles_lite._core.resources import AsyncResource
from miles_lite._core.reward_values import reward_problem
from miles_lite._core.validate import check_int, check_type
from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.engine.http.client import EngineClient
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

__all__ = ["DEFAULT_CLIENT", "ApiScorer", "ApiScorerStatistics", "decode_scores", "encode_samples"]

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


#: The client settings of an ApiScorer unless given: 60 s for a whole call, no separate
#: read timeout, answers up to 8 MiB, two retries (of what never reached the server and
#: of 502/503/504) after 0.5 s and 1 s.
DEFAULT_CLIENT = EngineClientConfig(
    read_timeout_s=None,
    total_timeout_s=60.0,
    max_body_bytes=8 << 20,
    retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.5, backoff_max_s=1.0, jitter=0.0),
)


@dataclass(frozen=True, slots=True)
class ApiScorerStatistics:
    """What an :class:`ApiScorer` did since it was made.

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


class ApiScorer(AsyncResource):
    """Score samples with a remote HTTP API, at most ``max_concurrency`` requests at once.

    Each :meth:`score` call is one ``POST url`` with a JSON body (``encode(samples)``,
    :func:`encode_samples` by default: ``{"samples": [{"index", "prompt", "response",
    ...}]}``) whose JSON answer ``decode`` turns into one score per sample
    (:func:`decode_scores` by default: ``{"scores": [0.5, {"acc": 1.0}, ...]}``). Scores are
    numbers (returned as float) or dicts. ``encode``/``decode`` run on the event loop: keep
    them cheap.

    ``client`` is the :class:`~miles_lite.engine.EngineClientConfig` of its one engine
    client: timeouts, body limit, headers (an ``Authorization``), and the retry policy.
    So transport errors and retries are the engines': what never reached the server
    (refused, DNS, connect timeout) and 502/503/504 answers are retried, the call keeping
    its slot meanwhile; a timeout or a reset once the request is sent, another status, a
    malformed answer are not. Every 2xx is accepted. The default config: 60 s total, no
    read timeout, 8 MiB answers, 2 retries after 0.5 s. Usage::

        async with ApiScorer("http://rm:8000/score", max_concurrency=16) as scorer:
            scores = await scorer.score(samples)

    Raises ``ConfigError`` on a bad option.
    """

    _resource_name = "ApiScorer"

    def __init__(
        self,
        url: str,
        *,
        max_concurrency: int = 8,
        client: EngineClientConfig | None = None,
        encode: Callable[[list[Sample]], Any] = encode_samples,
        decode: Callable[[Any], list[Any]] = decode_scores,
    ) -> None:
        """Record the options; the HTTP session opens with ``async with``."""
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"ApiScorer url must start with http:// or https://, got {url!r}")
        check_int("ApiScorer", "max_concurrency", max_concurrency)
        config = client if client is not None else DEFAULT_CLIENT
        check_type("ApiScorer", "client", config, EngineClientConfig)
        self.url = url
        self.max_concurrency = max_concurrency
        self.config = config
        self._encode = encode
        self._decode = decode
        # The engine layer's client: one transport-error translation and one retry policy.
        parts = urlsplit(url)
        self._base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        self._path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._client = EngineClient(
            dataclasses.replace(
                config,
                max_connections=max_concurrency,
                max_connections_per_host=max_concurrency,
            )
        )
        self._limiter = anyio.Semaphore(max_concurrency)
        self._outstanding = 0
        self._in_flight = 0
        self._calls = 0
        self._max_depth = 0
        self._max_waiting = 0
        self._failures = 0

    def _describe(self) -> str:
        return f"ApiScorer for {self.url}"

    async def _open(self) -> None:
        await self._client.__aenter__()

    async def _close(self) -> None:
        # Calls still in flight fail.
        await self._client.aclose()

    def statistics(self) -> ApiScorerStatistics:
        """A snapshot of the queue-depth and retry counters (see :class:`ApiScorerStatistics`)."""
        return ApiScorerStatistics(
            calls=self._calls,
            max_queue_depth=self._max_depth,
            max_waiting=self._max_waiting,
            in_flight=self._in_flight,
            waiting=self._outstanding - self._in_flight,
            retries=self._client.statistics().retries,
            failures=self._failures,
        )

    async def score(self, samples: list[Sample]) -> list[float | dict[str, Any]]:
        """POST ``samples`` and return one score per sample, in order.

        Waits for a slot when ``max_concurrency`` calls are in flight. Raises
        ``RewardError`` (with ``url``, naming the sample indices) on an HTTP error status,
        a connection error or timeout (after the retries), a body over
        ``max_response_bytes``, malformed JSON, or a wrong number or type of scores;
        ``ClosedResourceError`` after :meth:`aclose`. On cancellation the request is
        abandoned (its connection closed) and the slot freed.
        """
        self._check_open(url=self.url)
        if not samples:
            return []
        where = _indices(samples)
        client = self._client

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

    async def _post(self, client: EngineClient, payload: Any, where: str) -> Any:
        """One POST under the engine layer's retry policy; returns the parsed JSON answer.

        The client retries only what never reached the server and 502/503/504: a scoring
        request the server received is never sent twice.
        """
        retries = self.config.retry.max_attempts - 1
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
                f"reward API gave no answer for {where} within its timeout "
                f"(not retried: the request may be running): {exc}",
                url=self.url,
            ) from exc
        except BodyTooLargeError as exc:
            raise RewardError(
                f"reward API answer for {where} exceeds max_body_bytes="
                f"{self.config.max_body_bytes}: {exc}",
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
            problem = reward_problem(value)  # the one rule for reward values
            if problem is not None:
                raise RewardError(
                    f"reward API score for sample {sample.index} is {value!r}: {problem}",
                    url=self.url,
                )
            out.append(value if isinstance(value, dict) else float(value))
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
