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

import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
from aiohttp import web

from miles_lite._core.serve import serve_app
from miles_lite.sglang.sampling import SAMPLING_KEYS
from miles_lite.testing.errors import StandInError
from miles_lite.testing.text.chat import (
    ChatBadRequest,
    TemplateCache,
    chat_choice,
    chat_options,
    chat_response,
    chat_stream_chunks,
)
from miles_lite.testing.text.model import TinyModel, TinyModelPolicy
from miles_lite.testing.text.policy import TextPolicy, fast_decode, fast_encode, token_logprob

__all__ = [
    "SAMPLING_KEYS",
    "SGLANG_VERSION",
    "TextEngineStatistics",
    "TextEngineStats",
    "TextStandInConfig",
    "TextStandInEngine",
]

#: The SGLang release whose answers this stand-in mirrors.
SGLANG_VERSION = "0.5.23"

_INT_KEYS = ("max_new_tokens", "min_new_tokens", "n", "top_k", "sampling_seed", "stream_interval")
_BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_FLOAT_KEYS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_DEFAULT_MAX_NEW_TOKENS = 128
_ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
#: Where tokens past the end of a scripted answer come from (ordinary BPE tokens).
_FILLER = 1000
#: Tokens decoded to look for a stop string: longer than any stop string a test uses.
_STOP_WINDOW = 32
#: Text longer than this is tokenized in a worker thread (about 1 ms of work inline).
_INLINE_CHARS = 8192
_LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


@dataclass(frozen=True, kw_only=True)
class TextStandInConfig:
    """How the text stand-in behaves. Times in seconds.

    Usage: ``TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(rules=[...]))``.

    ``policy``: what it answers (scripted, or :class:`TinyModelPolicy`). ``token_latency_s``: time per output token.
    ``max_running``: batch slots (more requests wait). ``context_length``: prompt plus
    output tokens at most. ``warmup_s``: ``/health``, ``/health_generate``, ``/generate``
    and chat answer 503 for this long after start. ``model_path`` and ``weight_version``:
    what the model endpoints report. ``request_log_limit``: how many request bodies and
    rids the statistics keep.
    """

    policy: TextPolicy | TinyModelPolicy = field(default_factory=TextPolicy)
    token_latency_s: float = 0.0
    max_running: int = 64
    context_length: int = 4096
    model_path: str = "stand-in/qwen3-tokenizer"
    weight_version: str = "default"
    host: str = "127.0.0.1"
    port: int = 0
    request_log_limit: int = 10_000
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("token_latency_s", "warmup_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"TextStandInConfig.{name} must be >= 0, got {value!r}")
        if not isinstance(self.policy, TextPolicy | TinyModelPolicy):
            raise ValueError(
                "TextStandInConfig.policy must be a TextPolicy or a TinyModelPolicy,"
                f" got {self.policy!r}"
            )
        for name in ("max_running", "context_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(
                    f"TextStandInConfig.{name} must be an int >= 1, got {getattr(self, name)!r}"
                )


@dataclass
class TextEngineStats:
    """Counters of one :class:`TextStandInEngine`, updated as it runs.

    ``requests``: the JSON bodies of ``/generate`` received (oldest first, bounded);
    ``rids_seen``: the rids generated for (both logs keep the first
    ``request_log_limit``); ``aborts``: ``/abort_request`` bodies;
    ``running`` / ``waiting``: generating now / waiting for a slot; ``max_running_seen``:
    the most generating at once; ``generated_tokens``: output tokens made in all.
    """

    requests: list[Any] = field(default_factory=list)
    rids_seen: list[str] = field(default_factory=list)
    aborts: list[Any] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    max_running_seen: int = 0
    generated_tokens: int = 0
    chat_requests: int = 0


@dataclass(frozen=True, kw_only=True)
class TextEngineStatistics:
    """A snapshot of :class:`TextEngineStats` (:meth:`TextStandInEngine.statistics`).

    ``requests`` are the bodies of ``/generate`` and ``/v1/chat/completions`` received;
    ``chat_requests`` counts the latter; ``template_cache_hits`` counts chat renders
    served from the cache; ``paused`` is whether ``/pause_generation`` holds generation.
    """

    requests: tuple[Any, ...]
    rids_seen: tuple[str, ...]
    aborts: tuple[Any, ...]
    running: int
    waiting: int
    max_running_seen: int
    generated_tokens: int
    chat_requests: int
    template_cache_hits: int
    weight_version: str
    paused: bool


class _Call:
    """One prompt generating: its rid, abort flag and the tokens made so far."""

    __slots__ = ("aborted", "logprobs", "out", "progress", "rid")

    def __init__(self, rid: str, *, streaming: bool = False) -> None:
        self.rid = rid
        self.aborted = anyio.Event()
        self.out: list[int] = []
        # The model policy's log-probs of ``out`` (the scripted one computes its own).
        self.logprobs: list[float] = []
        # Set (and replaced) after each token: what a streaming answer waits on. None
        # when nobody streams: an event per token costs more than making the token.
        self.progress = anyio.Event() if streaming else None

    def advanced(self) -> None:
        if self.progress is not None:
            self.progress.set()
            self.progress = anyio.Event()


class _BadRequest(Exception):
    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload)
        self.payload = payload


class TextStandInEngine:
    """The stand-in text engine (see the module docstring); an async context manager.

    Usage::

        async with TextStandInEngine(TextStandInConfig(), tokenizer) as engine:
            ...  # POST f"{engine.url}/generate" or f"{engine.url}/v1/chat/completions"

    ``stats`` is live (read it at any time); :meth:`statistics` is a frozen snapshot.
    Closing it ends requests still generating (as aborted).
    """

    def __init__(self, config: TextStandInConfig | None = None, tokenizer: Any = None) -> None:
        self.config = config if config is not None else TextStandInConfig()
        # None: the Qwen3 tokenizer, loaded on start (in a worker thread: it reads files).
        self.tokenizer: Any = None
        self.stats = TextEngineStats()
        self.weight_version = self.config.weight_version
        self.templates = TemplateCache(None)
        # Tokenizer work too long for a loop step runs in threads, one at a time.
        self._tokenizing = anyio.CapacityLimiter(1)
        self._calls: set[_Call] = set()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._closed = False
        self._slots: anyio.Semaphore | None = None
        self._unpaused: anyio.Event | None = None
        self._eos = -1
        self._ready_at = 0.0
        if tokenizer is not None:
            self._use_tokenizer(tokenizer)
        self._model: TinyModel | None = None

    def _use_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.templates.tokenizer = tokenizer
        self._eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:port`` once started; RuntimeError before."""
        if self._url is None:
            raise RuntimeError("TextStandInEngine.url is known once the engine has started")
        return self._url

    def statistics(self) -> TextEngineStatistics:
        """A frozen snapshot of :attr:`stats`."""
        stats = self.stats
        return TextEngineStatistics(
            requests=tuple(stats.requests),
            rids_seen=tuple(stats.rids_seen),
            aborts=tuple(stats.aborts),
            running=stats.running,
            waiting=stats.waiting,
            max_running_seen=stats.max_running_seen,
            generated_tokens=stats.generated_tokens,
            chat_requests=stats.chat_requests,
            template_cache_hits=self.templates.hits,
            weight_version=self.weight_version,
            paused=self.paused,
        )

    @property
    def paused(self) -> bool:
        """Whether ``/pause_generation`` holds generation now."""
        return self._unpaused is not None and not self._unpaused.is_set()

    async def __aenter__(self) -> TextStandInEngine:
        if self._closed:
            raise StandInError("this TextStandInEngine was closed; create a new one")
        if self.tokenizer is None:
            from miles_lite.testing.tokenizers import load_qwen3_tokenizer

            self._use_tokenizer(await anyio.to_thread.run_sync(load_qwen3_tokenizer))
        policy = self.config.policy
        if isinstance(policy, TinyModelPolicy) and self._model is None:
            self._model = await anyio.to_thread.run_sync(
                policy.build, len(self.tokenizer), self.config.context_length
            )
        self._slots = anyio.Semaphore(self.config.max_running)
        self._ready_at = time.monotonic() + self.config.warmup_s
        self._unpaused = anyio.Event()
        self._unpaused.set()
        app = web.Application(client_max_size=64 << 20)
        add_post, add_get = app.router.add_post, app.router.add_get
        add_post("/generate", self._generate)
        add_post("/v1/chat/completions", self._chat)
        add_post("/abort_request", self._abort_request)
        add_get("/v1/loads", self._loads)
        add_get("/get_loads", self._loads)
        add_post("/update_weight_version", self._update_weight_version)
        add_post("/update_weights_from_disk", self._update_weights_from_disk)
        add_post("/pause_generation", self._pause)
        add_post("/continue_generation", self._continue)
        add_get("/health", self._health)
        add_get("/health_generate", self._health)
        add_get("/model_info", self._model_info)
        add_get("/get_model_info", self._model_info)
        add_get("/server_info", self._server_info)
        add_get("/get_server_info", self._server_info)
        add_get("/v1/models", self._models)
        add_post("/flush_cache", self._flush_cache)
        add_get("/_stand_in/stats", self._stats)
        self._runner, self._url = await serve_app(app, self.config.host, self.config.port)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving: requests still generating end as aborted. Idempotent, bounded."""
        if self._closed:
            return
        self._closed = True
        self.abort(abort_all=True)
        if self._unpaused is not None:
            self._unpaused.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.move_on_after(5.0, shield=True):
                await runner.cleanup()

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort requests whose rid starts with ``rid`` (or all); returns how many."""
        count = 0
        for call in list(self._calls):
            if abort_all or (rid is not None and call.rid.startswith(rid)):
                call.aborted.set()
                count += 1
        return count

    # -- /generate -----------------------------------------------------------------------

    async def _read_json(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except ValueError as exc:
            raise _BadRequest(_error_payload(f"invalid JSON body: {exc}")) from exc

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if self._warming():
            return _error(503, "The server is not ready yet (warming up)")
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise _BadRequest(
                    _error_payload(
                        "1 validation error: Input should be a dictionary or an instance of"
                        " GenerateReqInput"
                    )
                )
            self._log(body)
            prompts, single = await self._prompts(body)
            params = _check_sampling(body.get("sampling_params") or {})
            _check_generate_options(body)
            for prompt in prompts:
                self._check_length(len(prompt), params)
        except _BadRequest as bad:
            return web.json_response(bad.payload, status=400)
        n = params.get("n", 1)
        expanded = [prompt for prompt in prompts for _ in range(n)]
        rids = body.get("rid")
        rids = [rids] if isinstance(rids, str) else rids
        if n > 1 or not isinstance(rids, list) or len(rids) != len(expanded):
            # SGLang replaces every rid of an n > 1 request with a random one.
            rids = [uuid.uuid4().hex for _ in expanded]
        stream = bool(body.get("stream"))
        calls = [
            (prompt, _Call(str(rid), streaming=stream))
            for prompt, rid in zip(expanded, rids, strict=True)
        ]
        if stream:
            return await self._stream(request, calls[0], params, body)
        answers = await self._run_all(calls, params, body)
        return web.json_response(answers[0] if single and len(answers) == 1 else answers)

    async def _run_all(
        self, calls: list[tuple[list[int], _Call]], params: dict[str, Any], body: dict[str, Any]
    ) -> list[dict[str, Any]]:
        if len(calls) == 1:
            return [await self._run(*calls[0], params, body)]
        answers: list[Any] = [None] * len(calls)

        async def run(i: int, prompt: list[int], call: _Call) -> None:
            answers[i] = await self._run(prompt, call, params, body)

        async with anyio.create_task_group() as tg:
            for i, (prompt, call) in enumerate(calls):
                tg.start_soon(run, i, prompt, call)
        return answers

    def _check_length(self, prompt_tokens: int, params: dict[str, Any]) -> None:
        """SGLang's own checks and words (``TokenizerManager``): the prompt, and the prompt
        plus ``max_new_tokens`` when given, must stay below the context length."""
        context = self.config.context_length
        max_new = params.get("max_new_tokens")
        if prompt_tokens >= context:
            message = (
                f"The input ({prompt_tokens} tokens) is longer than the model's context"
                f" length ({context} tokens)."
            )
        elif max_new is not None and prompt_tokens + max_new >= context:
            message = (
                "Requested token count exceeds the model's maximum context length of"
                f" {context} tokens. You requested a total of {prompt_tokens + max_new}"
                f" tokens: {prompt_tokens} tokens from the input messages and {max_new}"
                " tokens for the completion. Please reduce the number of tokens in the"
                " input messages or the completion to fit within the limit."
            )
        else:
            return
        raise _BadRequest({"error": {"message": message}})

    async def _encode(self, text: str) -> list[int]:
        if len(text) <= _INLINE_CHARS:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        ids: list[int] = await anyio.to_thread.run_sync(
            fast_encode, self.tokenizer, text, limiter=self._tokenizing
        )
        return ids

    def _log(self, body: Any) -> None:
        if len(self.stats.requests) < self.config.request_log_limit:
            self.stats.requests.append(body)

    async def _prompts(self, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
        ids = body.get("input_ids")
        text = body.get("text")
        if ids is not None:
            if isinstance(ids, list) and ids and all(_is_int(i) for i in ids):
                return [list(ids)], True
            if (
                isinstance(ids, list)
                and ids
                and all(isinstance(p, list) and p and all(_is_int(i) for i in p) for p in ids)
            ):
                return [list(p) for p in ids], False
            raise _BadRequest(
                _error_payload("input_ids must be a non-empty list of ints or of such lists")
            )
        if isinstance(text, str):
            return [await self._encode(text)], True
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [await self._encode(t) for t in text], False
        raise _BadRequest(_error_payload("Either text or input_ids should be provided."))

    async def _run(
        self, prompt: list[int], call: _Call, params: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        started = time.monotonic()
        self._calls.add(call)
        if len(self.stats.rids_seen) < self.config.request_log_limit:
            self.stats.rids_seen.append(call.rid)
        versions: list[str] = []
        finish: dict[str, Any]
        assert self._slots is not None
        try:
            self.stats.waiting += 1
            try:
                if self._slots.value > 0:  # a free slot: no task to watch for aborts
                    self._slots.acquire_nowait()
                    acquired = True
                else:
                    acquired = await self._wait_for_slot(call)
            finally:
                self.stats.waiting -= 1
            if not acquired:
                finish = dict(_ABORT)
            else:
                try:
                    self.stats.running += 1
                    self.stats.max_running_seen = max(
                        self.stats.max_running_seen, self.stats.running
                    )
                    finish = await self._decode(prompt, call, params, versions)
                finally:
                    self.stats.running -= 1
                    self._slots.release()
        finally:
            self._calls.discard(call)
        return self._answer(
            prompt, call.out, finish, call.rid, params, body, versions, started, call.logprobs
        )

    async def _wait_for_slot(self, call: _Call) -> bool:
        """Wait for a batch slot; False (and no slot held) if the call is aborted first."""
        assert self._slots is not None
        acquired = False
        with anyio.CancelScope() as waiting:
            async with anyio.create_task_group() as watch:
                watch.start_soon(_cancel_on, call.aborted, waiting)
                await self._slots.acquire()
                acquired = True
                watch.cancel_scope.cancel()
        return acquired

    async def _decode(
        self, prompt: list[int], call: _Call, params: dict[str, Any], versions: list[str]
    ) -> dict[str, Any]:
        """Make ``call.out`` token by token; returns the finish reason."""
        model, answer = self._model, []
        state: Any = None
        if model is not None:
            state = model.start(prompt, params.get("sampling_seed"), call.rid)
            temperature = float(params.get("temperature", 1.0))
        else:
            assert isinstance(self.config.policy, TextPolicy)
            answer = self.config.policy.answer(
                self.tokenizer, prompt, params.get("sampling_seed"), call.rid
            )
        max_new = params.get("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS)
        max_new = min(max_new, self.config.context_length - len(prompt))
        min_new = params.get("min_new_tokens", 0)
        stop_ids = set(params.get("stop_token_ids") or ())
        stops = params.get("stop") or []
        stops = [s for s in ([stops] if isinstance(stops, str) else stops) if s]
        ignore_eos = params.get("ignore_eos", False)
        out = call.out
        latency = self.config.token_latency_s
        assert self._unpaused is not None
        while True:
            if len(out) >= max(max_new, 0):
                return {"type": "length", "length": len(out)}
            if not self._unpaused.is_set():
                with anyio.CancelScope() as held:
                    async with anyio.create_task_group() as watch:
                        watch.start_soon(_cancel_on, call.aborted, held)
                        await self._unpaused.wait()
                        watch.cancel_scope.cancel()
            if latency > 0 and not call.aborted.is_set():
                # An abort is seen at the next token, as SGLang sees it at the next step;
                # a plain sleep costs far less than a cancel scope per token.
                await anyio.sleep(latency)
            if call.aborted.is_set():
                return dict(_ABORT)
            position = len(out)
            if model is not None:
                token, logprob = await anyio.to_thread.run_sync(model.step, state, temperature)
                if call.aborted.is_set():
                    return dict(_ABORT)
            else:
                token = answer[position] if position < len(answer) else _FILLER + position % 20000
            if position < min_new and (token == self._eos or token in stop_ids):
                token = _FILLER + position  # a model cannot end before min_new_tokens
                if model is not None:
                    state["pending"] = [token]
            if model is not None:
                call.logprobs.append(logprob)
            out.append(token)
            versions.append(self.weight_version)
            self.stats.generated_tokens += 1
            call.advanced()
            if position + 1 < min_new:
                continue
            if token in stop_ids or (token == self._eos and not ignore_eos):
                return {"type": "stop", "matched": token}
            if stops:
                # Only the tail can hold a new match: decode a bounded window.
                tail = self.decode(out[-_STOP_WINDOW:], skip_special_tokens=False)
                for stop in stops:
                    if stop in tail:
                        return {"type": "stop", "matched": stop}

    def _answer(
        self,
        prompt: list[int],
        out: list[int],
        finish: dict[str, Any] | None,
        rid: str,
        params: dict[str, Any],
        body: dict[str, Any],
        versions: list[str],
        started: float | None,
        logprobs: Sequence[float] = (),
        *,
        first_chunk: bool = False,
    ) -> dict[str, Any]:
        """The answer in SGLang's key order; ``started`` None for a non-final stream chunk."""
        text = self.decode(out, skip_special_tokens=params.get("skip_special_tokens", True))
        matched = finish.get("matched") if finish and finish["type"] == "stop" else None
        if isinstance(matched, str) and not params.get("no_stop_trim") and matched in text:
            text = text[: text.rfind(matched)]  # SGLang drops a matched stop string
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "weight_version": versions[-1] if versions else self.weight_version,
            "num_retractions": 0,
        }
        if body.get("return_logprob"):
            with_text = bool(body.get("return_text_in_logprobs"))
            start = body.get("logprob_start_len", -1)
            meta["input_token_logprobs"] = (
                []
                if start is None or start < 0
                else [
                    [None if i == 0 else token_logprob(-i, t), t, self._piece(t, with_text)]
                    for i, t in enumerate(prompt)
                    if i >= start
                ]
            )
            meta["output_token_logprobs"] = [
                [
                    logprobs[i] if i < len(logprobs) else token_logprob(i, t),
                    t,
                    self._piece(t, with_text),
                ]
                for i, t in enumerate(out)
            ]
            meta["output_token_logprobs_length"] = len(out)
            top = body.get("top_logprobs_num") or 0
            if top > 0:
                # The stand-in's distribution puts its chosen token first: top-k = top-1.
                meta["input_top_logprobs"] = [
                    None if entry[0] is None else [entry] for entry in meta["input_token_logprobs"]
                ]
                meta["output_top_logprobs"] = [[entry] for entry in meta["output_token_logprobs"]]
        meta.update({"reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": 0})
        if started is not None:
            meta["weight_versions"] = _spans(versions)
        meta.update({"cached_tokens_details": None, "dp_rank": None})
        if started is not None:
            meta["e2e_latency"] = time.monotonic() - started
        if started is not None or first_chunk:
            # A stream's final chunk drops it again (see _stream), as SGLang's does.
            meta["response_sent_to_client_ts"] = time.time()
        answer: dict[str, Any] = {"text": text, "output_ids": list(out), "meta_info": meta}
        if body.get("return_prompt_token_ids"):
            answer["prompt_token_ids"] = prompt
        return answer

    def _piece(self, token: int, with_text: bool) -> str | None:
        return self.decode([token], skip_special_tokens=False) if with_text else None

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text of ``ids`` as the tokenizer gives it (:func:`fast_decode`)."""
        return fast_decode(self.tokenizer, ids, skip_special_tokens=skip_special_tokens)

    async def _stream(
        self,
        request: web.Request,
        job: tuple[list[int], _Call],
        params: dict[str, Any],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        # Cumulative chunks as tokens are made (captures/gen_stream.txt): an abort
        # mid-stream ends it with the partial output and finish type abort.
        prompt, call = job
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        final: dict[str, Any] = {}
        sent = 0
        first = True

        async def run() -> None:
            final.update(await self._run(prompt, call, params, body))
            call.advanced()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not final:
                progress = call.progress
                assert progress is not None  # a streaming call
                if len(call.out) > sent:
                    sent = len(call.out)
                    chunk = self._answer(
                        prompt,
                        call.out[:sent],
                        None,
                        call.rid,
                        params,
                        body,
                        [],
                        None,
                        call.logprobs[:sent],
                        first_chunk=first,
                    )
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    first = False
                    continue
                await progress.wait()
        final["meta_info"].pop("response_sent_to_client_ts", None)
        await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    # -- /v1/chat/completions ------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self._warming():
            return _error(503, "The server is not ready yet (warming up)")
        try:
            body = await self._read_json(request)
        except _BadRequest as bad:
            return web.json_response(bad.payload, status=400)
        try:
            options = chat_options(body)
            self._log(body)
            self.stats.chat_requests += 1
            prompt = await self.templates.prompt_ids(body, self._tokenizing)
            params = _check_sampling(options.sampling_params)
            self._check_length(len(prompt), params)
        except ChatBadRequest as bad:
            return web.json_response(bad.payload, status=400)
        except _BadRequest as bad:
            return web.json_response(_chat_error(bad), status=400)
        rid = options.rid or uuid.uuid4().hex
        # As SGLang: one rid for n == 1, random rids for the choices of n > 1.
        rids = [rid] if options.n == 1 else [uuid.uuid4().hex for _ in range(options.n)]
        if options.n > 1:
            rids[0] = rid
        # meta_info carries the log-prob triples only when the request asks for log-probs.
        generate_body = {"return_logprob": options.logprobs}
        calls = [(prompt, _Call(r)) for r in rids]
        answers = await self._run_all(calls, params, generate_body)
        if options.stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for chunk in chat_stream_chunks(rid, options, answers[0], self.tokenizer, len(prompt)):
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        choices = [
            chat_choice(self.tokenizer, i, answer, prompt, options)
            for i, answer in enumerate(answers)
        ]
        return web.json_response(chat_response(rid, options, choices, answers, len(prompt)))

    # -- control -------------------------------------------------------------------------

    async def _abort_request(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = {}
        self.stats.aborts.append(body)
        if isinstance(body, dict):
            if body.get("abort_all"):
                self.abort(abort_all=True)
            elif isinstance(body.get("rid"), str):
                self.abort(body["rid"])
        return web.Response(status=200)

    async def _loads(self, request: web.Request) -> web.Response:
        include = request.query.get("include")
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= _LOAD_SECTIONS:
            return web.json_response(
                {
                    "detail": f"Invalid include sections: {sections - _LOAD_SECTIONS}. "
                    f"Valid options: {sorted(_LOAD_SECTIONS)}"
                },
                status=400,
            )
        used = 0  # tokens held by running requests: their prompts and outputs so far
        load: dict[str, Any] = {
            "dp_rank": 0,
            "num_running_reqs": self.stats.running,
            "num_waiting_reqs": self.stats.waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": used,
            "num_total_tokens": used,
            "max_total_num_tokens": self.config.context_length * self.config.max_running,
            "max_running_requests": self.config.max_running,
            "token_usage": 0.0,
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": self.stats.running / self.config.max_running,
        }
        if sections is None or "all" in sections or "queues" in sections:
            load["queues"] = {
                "waiting": self.stats.waiting,
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
            }
        return web.json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "accelerator": None,
                "num_accelerators": 1,
                "loads": [load],
            }
        )

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = None
        new = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(new, str):
            return _error(400, "new_version must be a string")
        if body.get("abort_all_requests", False):
            self.abort(abort_all=True)
        self.weight_version = new
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {new}", "new_version": new}
        )

    async def _pause(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return _error(400, 'pause_generation needs a body {"mode": abort|retract|in_place}')
        assert self._unpaused is not None
        if self._unpaused.is_set():
            self._unpaused = anyio.Event()
        if mode == "abort":
            self.abort(abort_all=True)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.Response:
        assert self._unpaused is not None
        self._unpaused.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    def _warming(self) -> bool:
        return time.monotonic() < self._ready_at

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._warming() else 200)

    async def _update_weights_from_disk(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return _error(400, "update_weights_from_disk needs a body with a model_path string")
        new = body.get("weight_version")
        if new is not None and not isinstance(new, str):
            return _error(400, "weight_version must be a string")
        message = "Succeeded to update model weights."
        if new is not None:
            self.weight_version = new
            message += f" Weight version updated to {new}."
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
            }
        )

    async def _server_info(self, request: web.Request) -> web.Response:
        config = self.config
        return web.json_response(
            {
                "model_path": config.model_path,
                "tokenizer_path": config.model_path,
                "host": config.host,
                "port": int(self.url.rsplit(":", 1)[1]),
                "context_length": config.context_length,
                "max_running_requests": config.max_running,
                "served_model_name": config.model_path,
                "weight_version": self.weight_version,
                "tool_call_parser": "qwen25",
                "reasoning_parser": None,
                "version": SGLANG_VERSION,
                "stand_in": True,
                "token_latency_s": config.token_latency_s,
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model_path,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": self.config.model_path,
                        "parent": None,
                        "max_model_len": self.config.context_length,
                    }
                ],
            }
        )

    async def _flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are"
            " running or waiting requests, the operation will not be performed.)\n"
        )

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(dataclasses.asdict(self.statistics()))


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _check_sampling(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise _BadRequest({"error": f"invalid type: expected a map, got {type(params).__name__}"})
    for key, value in params.items():
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise _BadRequest({"error": f"unknown field `{key}`, expected one of {expected}"})
        if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            raise _BadRequest(
                {"error": f"invalid type: `{key}` expected an integer, got {value!r}"}
            )
        if key in _FLOAT_KEYS and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _BadRequest({"error": f"invalid type: `{key}` expected a number, got {value!r}"})
        if key == "stop" and not (
            isinstance(value, str)
            or (isinstance(value, list) and all(isinstance(s, str) for s in value))
        ):
            raise _BadRequest(
                {"error": f"invalid type: `stop` expected a string or a list, got {value!r}"}
            )
        if key == "stop_token_ids" and not (
            isinstance(value, list) and all(_is_int(i) for i in value)
        ):
            raise _BadRequest(
                {"error": f"invalid type: `stop_token_ids` expected a list, got {value!r}"}
            )
        if key in _BOOL_KEYS and not isinstance(value, bool):
            raise _BadRequest({"error": f"invalid type: `{key}` expected a boolean, got {value!r}"})
    return dict(params)


def _is_int(value: Any) -> bool:
    return type(value) is int  # not a bool, which is an int subclass


def _check_generate_options(body: dict[str, Any]) -> None:
    for key in ("return_logprob", "return_text_in_logprobs", "return_prompt_token_ids", "stream"):
        if key in body and not isinstance(body[key], bool):
            raise _BadRequest({"error": f"invalid type: `{key}` expected a boolean"})
    for key in ("logprob_start_len", "top_logprobs_num"):
        if key in body and body[key] is not None and not _is_int(body[key]):
            raise _BadRequest({"error": f"invalid type: `{key}` expected an integer"})
    rid = body.get("rid")
    if (
        rid is not None
        and not isinstance(rid, str)
        and not (isinstance(rid, list) and all(isinstance(r, str) for r in rid))
    ):
        raise _BadRequest({"error": "invalid type: `rid` expected a string or a list of strings"})


def _chat_error(bad: _BadRequest) -> dict[str, Any]:
    message = bad.payload.get("error") or bad.payload.get("message")
    if isinstance(message, dict):
        message = message.get("message")
    return ChatBadRequest(str(message)).payload


def _spans(versions: Sequence[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


def _error_payload(message: str, status: int = 400) -> dict[str, Any]:
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request" if status == 400 else "Service Unavailable",
        "param": None,
        "code": status,
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response(_error_payload(message, status), status=status)
