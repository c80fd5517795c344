"""What a text generate function gets as ``input.state``: tokenizer, router, settings, stop."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from miles_lite.engine.router import Router
from miles_lite.errors import ConfigError
from miles_lite.sglang.sampling import TextSamplingParams

__all__ = ["InFlightRequests", "TextState"]

T = TypeVar("T")


class InFlightRequests:
    """The rids of the rollout's requests that are out at an engine now (for the abort)."""

    def __init__(self) -> None:
        self._rids: dict[str, None] = {}

    @contextmanager
    def track(self, rid: str) -> Iterator[None]:
        """Count ``rid`` as in flight for the duration of the block."""
        self._rids[rid] = None
        try:
            yield
        finally:
            self._rids.pop(rid, None)

    def rids(self) -> list[str]:
        """A snapshot of the rids in flight, oldest first."""
        return list(self._rids)

    def __len__(self) -> int:
        return len(self._rids)


@dataclass
class TextState:
    """The resources of a text rollout, shared by its generate calls.

    - ``tokenizer`` (a ``transformers`` tokenizer with a chat template), ``processor``
      (for multimodal prompts, optional);
    - ``router``: leases engines (its ``client`` posts);
    - ``sampling``: the default sampling parameters; ``max_context_len``: the engines'
      context (prompt + output tokens), ``None`` if unknown;
    - ``in_flight``: rids out at an engine now; ``sessions``: the chat session server of
      agentic rollouts (``None`` otherwise);
    - the stop flag: once :meth:`request_stop` was called (early stop), generate
      functions send nothing new and end their samples ABORTED;
    - ``tokenize_threads``: worker threads for tokenizing and chat templating (default:
      a quarter of the cores, 1 to 4; see :meth:`off_loop`).
    """

    tokenizer: Any
    router: Router
    sampling: TextSamplingParams = field(default_factory=TextSamplingParams)
    max_context_len: int | None = None
    processor: Any = None
    sessions: Any = None
    in_flight: InFlightRequests = field(default_factory=InFlightRequests)
    tokenize_threads: int = field(default_factory=lambda: _default_tokenize_threads())
    _stopping: bool = False
    _limiter: anyio.CapacityLimiter | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        threads = self.tokenize_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"TextState.tokenize_threads must be an int >= 1, got {threads!r}")

    @property
    def stopping(self) -> bool:
        """Whether the rollout stopped early: send nothing new."""
        return self._stopping

    def request_stop(self) -> None:
        """Early stop: generate functions send nothing new from now on."""
        self._stopping = True

    def reset_stop(self) -> None:
        """A new rollout starts: sending is allowed again."""
        self._stopping = False

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` (tokenizing, chat templating) in a worker thread.

        Fast tokenizers release the GIL while they encode, so long prompts never stall
        the event loop. At most ``tokenize_threads`` run at once: each thread waiting to
        take the GIL back delays the loop by a switch interval, so a few threads keep the
        loop's worst wake-up short and lose no throughput on a few cores. Cancellation
        abandons the call (its result is dropped).
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.tokenize_threads)
        return await anyio.to_thread.run_sync(
            fn, *args, abandon_on_cancel=True, limiter=self._limiter
        )


def _default_tokenize_threads() -> int:
    # Measured on 2 busy cores (benchmarks/tokenize_loop_lag.py, 8 prompts of 79k
    # tokens): 1 thread kept the loop's worst wake-up at ~25 ms, 2 at ~40 ms, 8 at
    # ~150 ms, for the same wall time: the Rust tokenizer already uses the spare cores.
    return max(1, min(4, (os.cpu_count() or 1) // 4))
