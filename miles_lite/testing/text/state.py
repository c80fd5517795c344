"""What the text stand-in's parts share: its config, tokenizer, weights and statistics.

One :class:`EngineState` per engine. The scheduler, the ``/generate`` and chat endpoints
and the control endpoints all read it; the control endpoints change
:attr:`EngineState.weight_version`, every generated token records it. As in SGLang, the
version ``/model_info`` reports (:attr:`EngineState.info_version`) moves only when an
update succeeds: a weight update whose flush fails has already changed the tokens'.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from miles_lite.testing.text.config import TextStandInConfig
from miles_lite.testing.text.model import TinyModel, TinyModelPolicy
from miles_lite.testing.text.prefix_cache import PrefixCache
from miles_lite.testing.text.stats import TextEngineStats
from miles_lite.testing.text.templates import TemplateCache
from miles_lite.testing.tokenizers import fast_decode, fast_encode, load_qwen3_tokenizer

__all__ = ["EngineState"]

#: Text longer than this is tokenized in a worker thread (about 1 ms of work inline).
_INLINE_CHARS = 8192


class EngineState:
    """The shared state of one text stand-in (see the module docstring).

    ``tokenizer`` is None until :meth:`load` (or given); ``model`` is the tiny model when
    the policy is a :class:`TinyModelPolicy`, built by :meth:`load`.
    """

    def __init__(self, config: TextStandInConfig, tokenizer: Any = None) -> None:
        self.config = config
        self.stats = TextEngineStats()
        self.weight_version = config.weight_version
        self.info_version = config.weight_version
        self.cache = PrefixCache(max_depth=config.context_length)
        self.templates = TemplateCache(None)
        self.tokenizer: Any = None
        self.eos = -1
        self.model: TinyModel | None = None
        # Tokenizer work too long for a loop step runs in threads, one at a time.
        self.tokenizing = anyio.CapacityLimiter(1)
        self._ready_at = 0.0
        if tokenizer is not None:
            self.use_tokenizer(tokenizer)

    def use_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize, render chat templates and end answers (EOS) with ``tokenizer``."""
        self.tokenizer = tokenizer
        self.templates.tokenizer = tokenizer
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def load(self) -> None:
        """Load what is missing, in worker threads: the Qwen3 tokenizer (it reads files),
        the tiny model (about a second); then start the warm-up clock."""
        if self.tokenizer is None:
            self.use_tokenizer(await anyio.to_thread.run_sync(load_qwen3_tokenizer))
        policy = self.config.policy
        if isinstance(policy, TinyModelPolicy) and self.model is None:
            self.model = await anyio.to_thread.run_sync(
                policy.build, len(self.tokenizer), self.config.context_length
            )
        self._ready_at = time.monotonic() + self.config.warmup_s

    def warming(self) -> bool:
        """Whether the warm-up (``warmup_s`` after start) still runs: then 503s."""
        return time.monotonic() < self._ready_at

    def log_request(self, body: Any) -> None:
        """Keep a request body in the statistics (up to ``request_log_limit``)."""
        self.stats.log_request(body, self.config.request_log_limit, self.info_version)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids`` as the tokenizer gives it (:func:`fast_decode`)."""
        return fast_decode(self.tokenizer, ids, skip_special_tokens=skip_special_tokens)

    async def encode(self, text: str) -> list[int]:
        """The token ids of ``text``; a long text is tokenized in a worker thread."""
        if len(text) <= _INLINE_CHARS:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids: list[int] = await anyio.to_thread.run_sync(
            fast_encode, self.tokenizer, text, limiter=self.tokenizing
        )
        return ids
