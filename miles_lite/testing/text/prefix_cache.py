"""The text stand-in's prefix cache: which prompt tokens a request finds cached, as SGLang's
radix cache reports them in ``meta_info.cached_tokens``.

One token trie per cache namespace (SGLang's ``extra_key``: requests with different keys
never share a prefix). A finished request's tokens (prompt and output) are inserted; a
new request finds its longest cached prefix, at most all its prompt tokens but the last
(SGLang always computes the last one: a 10-token prompt seen before reports 9).
``/flush_cache`` empties it. Bounded: only a sequence's first ``max_depth`` tokens are
kept, and the whole cache is dropped past ``max_nodes`` (as eviction would).

The stand-in computes every answer from scratch whatever it finds here (its log-probs do
not depend on it): the cache only reports what SGLang's would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PrefixCache"]


class PrefixCache:
    """Cached prefixes per ``extra_key`` (see the module docstring)."""

    def __init__(self, *, max_depth: int = 4096, max_nodes: int = 200_000) -> None:
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self._roots: dict[str | None, dict[int, Any]] = {}
        self._nodes = 0

    def __len__(self) -> int:
        """Tokens (trie nodes) held."""
        return self._nodes

    def match(self, key: str | None, prompt: Sequence[int]) -> int:
        """The prompt tokens found cached under ``key`` (never the last one)."""
        node = self._roots.get(key)
        found = 0
        limit = min(len(prompt) - 1, self.max_depth)
        while node is not None and found < limit:
            node = node.get(prompt[found])
            if node is not None:
                found += 1
        return found

    def insert(self, key: str | None, tokens: Sequence[int]) -> None:
        """Cache ``tokens`` (a finished request's prompt and output) under ``key``."""
        if self._nodes > self.max_nodes:
            self.clear()
        node = self._roots.setdefault(key, {})
        for token in tokens[: self.max_depth]:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                self._nodes += 1
            node = child

    def clear(self) -> None:
        """Drop everything (``/flush_cache``)."""
        self._roots.clear()
        self._nodes = 0
