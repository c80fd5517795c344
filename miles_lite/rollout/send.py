"""The one send path of generation requests: ``/generate``, chat turns (any dialect) and
diffusion microgroups all go through :class:`Send`.

It owns what every generation request must do and what drifted when it was written twice:

- the stop check once the engine slot is taken (a request still waiting for a slot at
  the stop is never sent: the abort went out before it);
- in-flight tracking: the rid counts in the scope's :class:`InFlight` while it runs, with
  the engine it went to, so an early stop aborts it there;
- the weight version's cache key (``extra_key``, read at send time: a request held while
  the weights were updated leaves with the new version's key) and the KV marks of the
  answer's version spans (:meth:`Send.marked`);
- the never-re-send rule: the attempt posts with ``retry=False`` and only
  :meth:`Router.call <miles_lite.engine.router.Router.call>` retries, only what never
  reached an engine;
- abort at the engine of a request that reached it and then failed (a timeout, a reset)
  and, where the caller asks, of one whose caller went away (cancellation).

Subclasses say what an answer becomes (:meth:`Send.finish`) and how one attempt goes out
(:meth:`Send.request`); ``keyed`` / ``abortable`` say whether the engine takes a cache key
and aborts by rid (diffusion engines do neither).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from miles_lite.errors import EngineError, EngineStatusError
from miles_lite.rollout.context import InFlight
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import WeightSpan

if TYPE_CHECKING:
    from miles_lite.engine.http.response import BodyAllocator, RawResponse
    from miles_lite.engine.router import Router

__all__ = ["RawSend", "Send", "SendScope"]

R = TypeVar("R")
T = TypeVar("T")

#: Bound on aborting a request at its engine after it failed or its caller left (seconds).
ABORT_TIMEOUT_S = 2.0


class SendScope(Protocol):
    """What a request is sent in: whether to send nothing new (``stopping``) and the
    requests in flight it counts in. A :class:`~miles_lite.rollout.context.RunContext`
    is one; a chat session is another (it also stops when the session is aborted)."""

    @property
    def stopping(self) -> bool:
        """Whether nothing new may be sent."""
        ...

    @property
    def in_flight(self) -> InFlight:
        """The requests in flight the rid counts in."""
        ...


class _Stopped(Exception):
    """The scope stopped while the request waited for an engine slot: it is not sent."""


class Send(Generic[R, T]):
    """One generation request through the router's one retry loop (see the module
    docstring). Call :meth:`run` once: it returns :meth:`finish`'s value for the answer,
    or ``None`` when the scope stopped before the request was sent.

    The instance is the attempt ``Router.call`` awaits (``send(url)``): a slotted object,
    not a closure, one per request on the hot path; it remembers where (``url``) and
    under which weight version (``version``) it went last, and ``aborted``: why it was
    aborted at its engine (``"failed"``, ``"cancelled"``) or None.
    """

    __slots__ = (
        "abort_on_cancel",
        "abort_timeout_s",
        "aborted",
        "key",
        "path",
        "payload",
        "rid",
        "router",
        "scope",
        "span",
        "timeout_s",
        "url",
        "version",
    )

    #: Whether the engine takes SGLang's ``extra_key`` (the weight version's cache key).
    keyed: ClassVar[bool] = True
    #: Whether the engine aborts a request by rid (``/abort_request``).
    abortable: ClassVar[bool] = True

    def __init__(
        self,
        router: Router,
        scope: SendScope,
        path: str,
        payload: dict[str, Any],
        rid: str,
        span: UnitSpan | None = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        abort_on_cancel: bool = False,
        abort_timeout_s: float = ABORT_TIMEOUT_S,
    ) -> None:
        self.router = router
        self.scope = scope
        self.path = path
        self.payload = payload
        self.rid = rid
        self.span, self.key, self.timeout_s = span, key, timeout_s
        self.abort_on_cancel, self.abort_timeout_s = abort_on_cancel, abort_timeout_s
        self.url: str | None = None
        self.version: str | None = None
        self.aborted: str | None = None

    def __call__(self, url: str) -> Awaitable[R]:
        # Not a coroutine itself: it does its bookkeeping and hands back the request's
        # coroutine, one level less per request (Router.call awaits it; _Stopped raised
        # here is raised inside its try, as an awaited one would be).
        scope = self.scope
        # Checked after the slot is taken: a request still waiting at the stop is never
        # sent (it would run to its end: the abort went out before it).
        if scope.stopping:
            raise _Stopped
        scope.in_flight.sent_to(self.rid, url)
        self.url = url
        if self.keyed:
            # Read at send time: a request held while the weights were updated goes out
            # with the new version's cache key, so it never reuses KV computed before.
            versions = self.router.versions
            self.version = versions.current
            cache_key = versions.cache_key()
            if cache_key is not None:
                self.payload["extra_key"] = cache_key
        span = self.span
        if span is not None:
            span.engine = url
            span.requests += 1
            span.leased()
        return self.request(url)

    def request(self, url: str) -> Awaitable[R]:
        """One attempt at ``url``, never retried by itself (:class:`RawSend`: the payload
        as JSON with the engine client's ``post``, ``retry=False``)."""
        raise NotImplementedError

    def finish(self, response: R) -> T:
        """What the caller gets for an answer (decoded, checked, marked)."""
        raise NotImplementedError

    async def run(self) -> T | None:
        """Send the request (see the class docstring); raises the engine client's typed
        errors. A request that reached its engine and failed is aborted there (when the
        engine aborts by rid: a timeout or a reset leaves it generating); with
        ``abort_on_cancel``, one whose caller was cancelled too (shielded, bounded)."""
        rid = self.rid
        router = self.router
        done = False
        # Counted in flight by hand, not in a `with` block: its manager and bound __exit__
        # would be two more objects alive (and scanned by the collector) per request.
        in_flight = self.scope.in_flight
        in_flight.add(rid)
        try:
            response = await router.call(self, key=self.key)
            done = True
        except _Stopped:
            done = True
            return None
        except EngineError as exc:
            done = True
            url = self.url
            if (
                self.abortable
                and not exc.retryable
                and url is not None
                and not isinstance(exc, EngineStatusError)  # it answered: it is done
            ):
                self.aborted = "failed"
                await router.abort_request(url, rid, timeout_s=self.abort_timeout_s)
            raise
        finally:
            try:
                if not done and self.abort_on_cancel and self.abortable and self.url is not None:
                    # The caller went away (cancelled): stop the generation at the engine.
                    self.aborted = "cancelled"
                    await router.abort_request(self.url, rid, timeout_s=self.abort_timeout_s)
            finally:
                in_flight.discard(rid)
        return self.finish(response)

    def marked(self, spans: tuple[WeightSpan, ...], cached_tokens: int) -> tuple[WeightSpan, ...]:
        """The answer's weight version ``spans`` with the tokens made on KV from before an
        update marked (``kv_version``); ``spans`` itself when nothing is marked (no update
        recorded yet, or none kept old KV under this request)."""
        versions = self.router.versions
        if versions.current is None or not spans:
            return spans
        marked = versions.mark_kv(spans, sent_under=self.version, cached_tokens=cached_tokens)
        return spans if marked == spans else marked


class RawSend(Send["RawResponse", "RawResponse"]):
    """A :class:`Send` that POSTs the payload as JSON and returns the raw answer; ``into``
    allocates its body (an arena lease)."""

    __slots__ = ("into",)

    def __init__(
        self,
        router: Router,
        scope: SendScope,
        path: str,
        payload: dict[str, Any],
        rid: str,
        span: UnitSpan | None = None,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        abort_on_cancel: bool = False,
        abort_timeout_s: float = ABORT_TIMEOUT_S,
        into: BodyAllocator | None = None,
    ) -> None:
        super().__init__(
            router,
            scope,
            path,
            payload,
            rid,
            span,
            key=key,
            timeout_s=timeout_s,
            abort_on_cancel=abort_on_cancel,
            abort_timeout_s=abort_timeout_s,
        )
        self.into = into

    def request(self, url: str) -> Awaitable[RawResponse]:
        return self.router.client.post(
            url,
            self.path,
            self.payload,
            request_id=self.rid,
            into=self.into,
            timeout_s=self.timeout_s,
            retry=False,
        )

    def finish(self, response: RawResponse) -> RawResponse:
        return response
