r"""A stand-in SGLang text engine on loopback, answering as SGLang 0.5.23 does.

Usage::

    config = TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(rules=[
        TextRule(r"What is 2\+3", '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'),
    ]))
    async with TextStandInEngine(config) as engine:   # or TextEngineProcess(config)
        ...  # POST f"{engine.url}/generate"; engine.statistics()

Endpoints, in the shape of the captures (``tests/data/sglang_captures``), key for key:

- ``POST /generate``: ``text`` or ``input_ids`` (one or a batch), ``rid`` (one or a list),
  strict ``sampling_params`` (an unknown key or a wrong type is a 400 in SGLang's words),
  ``return_logprob`` (``output_token_logprobs`` triples), ``return_text_in_logprobs``,
  ``logprob_start_len``, ``top_logprobs_num``, ``return_prompt_token_ids``, ``stream``
  (cumulative SSE chunks, token by token), ``n > 1`` (random rids). Stop strings and stop
  ids with ``no_stop_trim``, ``max_new_tokens``, ``min_new_tokens``, ``ignore_eos``, EOS.
- ``POST /v1/chat/completions``: see :mod:`miles_lite.testing.text.chat`.
- ``POST /abort_request`` (rid prefix or ``abort_all``: the aborted request answers 200 with
  its partial output), ``GET /v1/loads`` (SGLang's LoadSnapshot keys, ``?include=``),
  ``POST /update_weight_version``, ``/update_weights_from_disk``, ``/pause_generation``
  (``abort`` / ``retract`` / ``in_place``), ``/continue_generation``, ``/flush_cache``,
  ``GET /health``, ``/health_generate`` (503 during ``warmup_s``), ``/model_info``,
  ``/server_info``, ``/v1/models``; ``GET /_stand_in/stats`` (the statistics as JSON).

What it generates comes from a seeded scripted policy over the real Qwen3 tokenizer
(:class:`~miles_lite.testing.text.policy.TextPolicy`). Each output token takes
``token_latency_s``; at most ``max_running`` requests generate at once, the rest wait
(``num_waiting_reqs``), so aborts find requests running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from miles_lite._core.resources import AsyncResource
from miles_lite.testing.text.chat import ChatEndpoint
from miles_lite.testing.text.config import TextStandInConfig
from miles_lite.testing.text.control import ControlEndpoints
from miles_lite.testing.text.generate import GenerateEndpoint
from miles_lite.testing.text.model import TinyModel
from miles_lite.testing.text.scheduler import Scheduler
from miles_lite.testing.text.server import make_app, start_app, stop_app
from miles_lite.testing.text.state import EngineState
from miles_lite.testing.text.stats import TextEngineStatistics, TextEngineStats
from miles_lite.testing.text.templates import TemplateCache

__all__ = ["TextStandInEngine"]


class TextStandInEngine(AsyncResource):
    """The stand-in text engine (see the module docstring); an async context manager.

    Usage::

        async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
            ...  # POST f"{engine.url}/generate" or f"{engine.url}/v1/chat/completions"

    ``tokenizer`` None loads the Qwen3 tokenizer on start. ``stats`` is live (read it at
    any time); :meth:`statistics` is a frozen snapshot. Closing it ends requests still
    generating (as aborted); a closed engine cannot be started again (the lifecycle is
    the library's one, :class:`~miles_lite._core.resources.AsyncResource`: ``async with``
    a closed engine raises its ClosedResourceError).

    It is a composition of its parts: ``engine_state``, an :class:`~.state.EngineState` (config,
    tokenizer, weights, statistics), a :class:`~.scheduler.Scheduler`, the endpoints of
    :mod:`.generate`, :mod:`.chat` and :mod:`.control`, served by :mod:`.server`.
    """

    _resource_name = "TextStandInEngine"

    def __init__(self, config: TextStandInConfig | None = None, tokenizer: Any = None) -> None:
        super().__init__()
        self.config = config if config is not None else TextStandInConfig()
        self.engine_state = EngineState(self.config, tokenizer)
        self.scheduler = Scheduler(
            self.config.max_running, self.config.token_latency_s, self.engine_state.stats
        )
        self._generate = GenerateEndpoint(self.engine_state, self.scheduler)
        self._chat = ChatEndpoint(self._generate)
        self._control = ControlEndpoints(
            self.engine_state, self.scheduler, url=lambda: self.url, statistics=self.statistics
        )
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:port`` once started; RuntimeError before."""
        if self._url is None:
            raise RuntimeError("TextStandInEngine.url is known once the engine has started")
        return self._url

    @property
    def stats(self) -> TextEngineStats:
        """The live counters (:class:`~miles_lite.testing.TextEngineStats`)."""
        return self.engine_state.stats

    @property
    def tokenizer(self) -> Any:
        """The tokenizer it answers with (None before start when none was given)."""
        return self.engine_state.tokenizer

    @property
    def templates(self) -> TemplateCache:
        """The chat-template renders it keeps."""
        return self.engine_state.templates

    @property
    def model(self) -> TinyModel | None:
        """The tiny model once started with a :class:`~miles_lite.testing.TinyModelPolicy`."""
        return self.engine_state.model

    @property
    def weight_version(self) -> str:
        """The weight version answers report now (the update endpoints change it)."""
        return self.engine_state.weight_version

    @weight_version.setter
    def weight_version(self, version: str) -> None:
        self.engine_state.weight_version = self.engine_state.info_version = version

    @property
    def paused(self) -> bool:
        """Whether ``/pause_generation`` holds generation now."""
        return self.scheduler.paused

    def statistics(self) -> TextEngineStatistics:
        """A frozen snapshot of :attr:`stats`."""
        return self.engine_state.stats.snapshot(
            template_cache_hits=self.engine_state.templates.hits,
            weight_version=self.engine_state.weight_version,
            paused=self.paused,
        )

    async def _open(self) -> None:
        await self.engine_state.load()
        self.scheduler.start()
        app = make_app(self._generate, self._chat, self._control)
        self._runner, self._url = await start_app(app, self.config.host, self.config.port)

    async def _close(self) -> None:
        """Stop serving: requests still generating end as aborted. Bounded."""
        self.scheduler.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await stop_app(runner)

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests whose rid starts with ``rid`` (or all); returns how many."""
        return self.scheduler.abort(rid, abort_all=abort_all)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids`` as the tokenizer gives it (:func:`~miles_lite.testing.tokenizers.fast_decode`)."""
        return self.engine_state.decode(ids, skip_special_tokens=skip_special_tokens)
