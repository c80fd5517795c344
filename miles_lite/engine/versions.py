"""The policy versions the engines were updated to, in order: what a request's cache key
is, which tokens were made on context computed by older weights, and how far behind a
version is.

No I/O. The router holds one (:attr:`Router.versions
<miles_lite.engine.router.Router.versions>`); a weight update records each version
before generation continues, so every answer that arrives after it is read against it.
Versions are strings (SGLang's ``weight_version``); their order is the order in which
they were recorded, not their text.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from miles_lite.errors import ConfigError
from miles_lite.types import WeightSpan

__all__ = ["VersionRecord", "WeightVersions"]


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """One weight update: the ``version`` pushed, the pause ``mode``, and ``kept_kv``:
    whether requests in flight across it went on with KV computed by the weights before
    it (an ``in_place`` pause, or no cache flush); ``at`` is its ``time.monotonic()``."""

    version: str
    mode: str
    kept_kv: bool
    at: float


class WeightVersions:
    """The versions recorded so far, oldest first (see the module docstring).

    A version never recorded (the engines' own before the first update, such as SGLang's
    ``"default"``) is older than every recorded one: its index is -1.
    """

    def __init__(self) -> None:
        self._records: list[VersionRecord] = []
        self._index: dict[str, int] = {}
        #: The version the engines reported before the first update (learned by it).
        self.base: str | None = None

    def learn_base(self, seen: Sequence[str]) -> None:
        """The engines' own version before the first update: the one most of ``seen``
        (what they reported) name; None when none did."""
        self.base = max(set(seen), key=list(seen).count) if seen else None

    @property
    def current(self) -> str | None:
        """The version the engines were last updated to; None before any update."""
        return self._records[-1].version if self._records else None

    @property
    def records(self) -> tuple[VersionRecord, ...]:
        """Every update, oldest first."""
        return tuple(self._records)

    def check_new(self, version: str) -> None:
        """Raise :class:`ConfigError` unless ``version`` may be recorded next: a non-empty
        str never used before (nor the engines' own, :attr:`base`), or the current one (a
        retry of the last update)."""
        if not isinstance(version, str) or not version:
            raise ConfigError(f"a weight version must be a non-empty str, got {version!r}")
        index = self._index.get(version)
        if (index is not None and index != len(self._records) - 1) or (
            index is None and version == self.base
        ):
            raise ConfigError(
                f"weight version {version!r} was used before (current {self.current!r}):"
                " versions only move forward"
            )

    def record(self, version: str, *, mode: str, kept_kv: bool) -> VersionRecord:
        """Make ``version`` the current one. Recording the current version again (a retry
        of the last update) changes nothing but ``kept_kv`` (kept once kept); an older
        one raises :class:`ConfigError` (versions only move forward, see
        :meth:`check_new`)."""
        self.check_new(version)
        index = self._index.get(version)
        if index is not None:
            last = self._records[-1]
            self._records[-1] = dataclasses.replace(last, kept_kv=last.kept_kv or kept_kv)
            return self._records[-1]
        entry = VersionRecord(version, mode, kept_kv, time.monotonic())
        self._index[version] = len(self._records)
        self._records.append(entry)
        return entry

    def index(self, version: str) -> int:
        """The update that recorded ``version`` (0 is the first); -1 if none did."""
        return self._index.get(version, -1)

    def lag(self, version: str) -> int:
        """How many updates behind the current version ``version`` is (0: current)."""
        return len(self._records) - 1 - self.index(version)

    def kept_kv(self, version: str) -> bool:
        """Whether requests in flight across the update to ``version`` kept older KV."""
        index = self._index.get(version)
        return index is not None and self._records[index].kept_kv

    def cache_key(self) -> str | None:
        """The ``extra_key`` a request sent now carries: the current version's, so that no
        request after an update reuses prefix KV computed before it; None before any
        update (the engines' cache is shared as usual)."""
        current = self.current
        return None if current is None else f"miles-lite-weights:{current}"

    def mark_kv(
        self, spans: Sequence[WeightSpan], *, sent_under: str | None, cached_tokens: int
    ) -> tuple[WeightSpan, ...]:
        """One answer's version spans (in order), each span made on KV from before an
        update that kept it marked with ``kv_version``: the oldest version whose KV was
        still in its context.

        ``sent_under``: the current version when the request left (its cache key; None
        before any update); ``cached_tokens``: its prompt tokens the engine found cached.
        A request whose prompt hit the cache took that KV from its key's version: if it
        went out just before an update that kept KV, even its first tokens are marked. A
        flushing update in between (the request was recomputed under its weights) starts
        the context again from that update's version.
        """
        out: list[WeightSpan] = []
        kv: str | None = None
        previous = -1
        if cached_tokens > 0:
            kv = sent_under if sent_under is not None else self.base
            previous = -1 if sent_under is None else self.index(sent_under)
        for span in spans:
            at = self.index(span.version)
            if kv is not None and at > previous:
                flushed = [r for r in self._records[previous + 1 : at + 1] if not r.kept_kv]
                if flushed:
                    kv = flushed[-1].version
            if kv is None or kv == span.version:
                kv = span.version
                out.append(span)
            else:
                out.append(dataclasses.replace(span, kv_version=kv))
            previous = max(previous, at)
        return tuple(out)
