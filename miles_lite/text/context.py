"""What a text generate function gets as ``input.context``: the rollout's resources."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from miles_lite._core.memo import SharedCalls
from miles_lite._core.validate import check_int
from miles_lite.engine.router import Router
from miles_lite.sglang.sampling import TextSamplingParams

__all__ = ["RECENT_PROMPT_IDS", "TextContext", "TokenizerThreads"]

T = TypeVar("T")

#: How many prompt ids :attr:`TextContext.recent_prompts` keeps at most (8 MB as int64).
RECENT_PROMPT_IDS = 1 << 20


def _ids_of(kept: array[int]) -> list[int]:
    return kept.tolist()


@dataclass
class TokenizerThreads:
    """A tokenizer and the worker threads it runs in off the event loop (at most
    ``threads`` at once): what tokenizing needs of a context, without its engines (a
    session server's worker process has a tokenizer and no router)."""

    tokenizer: Any
    threads: int = 1
    _limiter: anyio.CapacityLimiter | None = field(default=None, init=False, repr=False)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` (tokenizing, chat templating) in a worker thread.

        Fast tokenizers release the GIL while they encode, so long prompts never stall
        the event loop. At most ``threads`` run at once: each thread waiting to take the
        GIL back delays the loop by a switch interval, so a few threads keep the loop's
        worst wake-up short and lose no throughput on a few cores. Cancellation abandons
        the call (its result is dropped).
        """
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        return await anyio.to_thread.run_sync(
            fn, *args, abandon_on_cancel=True, limiter=self._limiter
        )


@dataclass
class TextContext:
    """The resources of a text rollout, shared by its generate calls (long-lived: what
    belongs to one run is in ``input.run``).

    - ``tokenizer`` (a ``transformers`` tokenizer with a chat template), ``processor``
      (for multimodal prompts, optional);
    - ``router``: leases engines (its ``client`` posts);
    - ``sampling``: the default sampling parameters; ``max_context_len``: the engines'
      context (prompt + output tokens), ``None`` if unknown; ``vocab_size``: ids an
      answer may hold are checked to lie below it (``None``: only that they are ints >= 0);
    - ``tokenize_threads``: worker threads for tokenizing and chat templating (see
      :meth:`off_loop`);
    - ``recent_prompts``: the checked ids of recent prompts, by content (a group's samples
      tokenize their prompt once: :func:`~miles_lite.text.tokenize.sample_prompt_ids`),
      kept as arrays, at most :data:`RECENT_PROMPT_IDS` ids in all;
      ``chat_template_compiled``: a chat prompt was rendered (short ones may now be
      rendered on the loop: :func:`~miles_lite.text.tokenize.prompt_ids`).
    """

    tokenizer: Any
    router: Router
    sampling: TextSamplingParams = field(default_factory=TextSamplingParams)
    max_context_len: int | None = None
    processor: Any = None
    vocab_size: int | None = None
    tokenize_threads: int = 1
    _payload: dict[str, Any] = field(init=False, repr=False)
    _mutable_keys: tuple[str, ...] = field(init=False, repr=False)
    _threads: TokenizerThreads | None = field(default=None, init=False, repr=False)
    recent_prompts: SharedCalls[array[int], list[int]] = field(
        default_factory=lambda: SharedCalls(_ids_of, cost=len, budget=RECENT_PROMPT_IDS),
        init=False,
        repr=False,
    )
    chat_template_compiled: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("TextContext", "tokenize_threads", self.tokenize_threads)
        check_int("TextContext", "max_context_len", self.max_context_len, optional=True)
        check_int("TextContext", "vocab_size", self.vocab_size, optional=True)
        # Built once: the sampling params were checked when made.
        self._payload = self.sampling.to_payload()
        self._mutable_keys = tuple(
            k for k, v in self._payload.items() if type(v) is list or type(v) is dict
        )

    def sampling_params(self) -> dict[str, Any]:
        """A fresh copy of the default ``sampling_params`` (its lists and dicts copied too)."""
        params = self._payload.copy()
        for key in self._mutable_keys:
            params[key] = params[key].copy()
        return params

    @property
    def threads(self) -> TokenizerThreads:
        """The tokenizer with its worker threads (:meth:`off_loop` runs there)."""
        if self._threads is None:
            self._threads = TokenizerThreads(self.tokenizer, self.tokenize_threads)
        return self._threads

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` (tokenizing, chat templating) in a worker thread: see
        :meth:`TokenizerThreads.off_loop`."""
        return await self.threads.off_loop(fn, *args)
