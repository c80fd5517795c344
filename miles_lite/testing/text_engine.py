"""A stand-in SGLang text engine on loopback: ``/generate`` and the control endpoints.

It answers exactly in the shape of SGLang 0.5.23's captures (``tests/data/sglang_captures``):
``output_ids``, ``meta_info`` with ``output_token_logprobs`` triples, ``finish_reason``
objects, ``weight_version(s)``; strict ``sampling_params`` (an unknown key is a 400 in
SGLang's words); stop strings and stop token ids with ``no_stop_trim``; ``n > 1`` with
replaced rids; rid-prefix ``/abort_request`` and ``abort_all`` answering the aborted
request with its partial output; ``/v1/loads``; ``/update_weight_version``; SSE streaming.
What it generates comes from a seeded scripted policy over the real Qwen3 tokenizer
(:class:`~miles_lite.testing.text_policy.TextPolicy`). Each output token takes
``token_latency_s``; at most ``max_running`` requests generate at once, the rest wait.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
from aiohttp import web

from miles_lite.errors import ClosedResourceError, ConfigError
from miles_lite.testing.text_policy import TextPolicy, token_logprob

__all__ = ["SAMPLING_KEYS", "TextEngineStats", "TextStandInConfig", "TextStandInEngine"]

#: The sampling keys SGLang 0.5.23 accepts, in the order its error message lists them.
SAMPLING_KEYS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
_INT_KEYS = ("max_new_tokens", "min_new_tokens", "n", "top_k", "sampling_seed", "stream_interval")
_BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True, kw_only=True)
class TextStandInConfig:
    """How the text stand-in behaves. Times in seconds.

    Usage: ``TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(rules=[...]))``.
    """

    policy: TextPolicy = field(default_factory=TextPolicy)
    token_latency_s: float = 0.0
    max_running: int = 64
    context_length: int = 4096
    model_path: str = "stand-in/qwen3-tokenizer"
    weight_version: str = "default"
    host: str = "127.0.0.1"
    port: int = 0
    request_log_limit: int = 10_000

    def __post_init__(self) -> None:
        if not self.token_latency_s >= 0:
            raise ConfigError(f"token_latency_s must be >= 0, got {self.token_latency_s!r}")
        for name in ("max_running", "context_length"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")


@dataclass
class TextEngineStats:
    """Counters of one :class:`TextStandInEngine`, updated as it runs.

    ``requests``: the JSON bodies of ``/generate`` received (oldest first, bounded);
    ``rids_seen``: every rid generated for; ``aborts``: ``/abort_request`` bodies;
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


class _Call:
    """One prompt generating: its rid, abort flag and the tokens made so far."""

    __slots__ = ("aborted", "out", "progress", "rid")

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.aborted = anyio.Event()
        self.out: list[int] = []
        # Set (and replaced) after each token: what a streaming answer waits on.
        self.progress = anyio.Event()

    def advanced(self) -> None:
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
            ...  # POST f"{engine.url}/generate"

    ``stats`` may be read at any time. Closing it ends requests still generating.
    """

    def __init__(self, config: TextStandInConfig | None = None, tokenizer: Any = None) -> None:
        if tokenizer is None:
            from miles_lite.testing.tokenizers import load_qwen3_tokenizer

            tokenizer = load_qwen3_tokenizer()
        self.config = config if config is not None else TextStandInConfig()
        self.tokenizer = tokenizer
        self.stats = TextEngineStats()
        self.weight_version = self.config.weight_version
        self._calls: set[_Call] = set()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._closed = False
        self._slots: anyio.Semaphore | None = None
        self._eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:port`` once started; RuntimeError before."""
        if self._url is None:
            raise RuntimeError("TextStandInEngine.url is known once the engine has started")
        return self._url

    async def __aenter__(self) -> TextStandInEngine:
        if self._closed:
            raise ClosedResourceError("this TextStandInEngine was closed; create a new one")
        self._slots = anyio.Semaphore(self.config.max_running)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort_request)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_post("/update_weight_version", self._update_weight_version)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/flush_cache", self._flush_cache)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.host, self.config.port).start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"
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

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return _error(400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return _error(
                400,
                "1 validation error: Input should be a dictionary or an instance of"
                " GenerateReqInput",
            )
        if len(self.stats.requests) < self.config.request_log_limit:
            self.stats.requests.append(body)
        try:
            prompts, single = self._prompts(body)
            params = _check_sampling(body.get("sampling_params") or {})
        except _BadRequest as bad:
            return web.json_response(bad.payload, status=400)
        n = params.get("n", 1)
        expanded = [prompt for prompt in prompts for _ in range(n)]
        rids = body.get("rid")
        rids = [rids] if isinstance(rids, str) else rids
        if n > 1 or not isinstance(rids, list) or len(rids) != len(expanded):
            # SGLang replaces every rid of an n > 1 request with a random one.
            rids = [uuid.uuid4().hex for _ in expanded]
        jobs = list(zip(expanded, rids, strict=True))
        if body.get("stream"):
            return await self._stream(request, jobs[0], params, body)
        answers: list[Any] = [None] * len(jobs)

        async def run(i: int, prompt: list[int], rid: str) -> None:
            answers[i] = await self._run(prompt, rid, params, body)

        async with anyio.create_task_group() as tg:
            for i, (prompt, rid) in enumerate(jobs):
                tg.start_soon(run, i, prompt, rid)
        return web.json_response(answers[0] if single and len(answers) == 1 else answers)

    def _prompts(self, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
        ids = body.get("input_ids")
        text = body.get("text")
        if ids is not None:
            if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
                return [list(ids)], True
            if isinstance(ids, list) and ids and all(isinstance(p, list) for p in ids):
                return [list(p) for p in ids], False
            raise _BadRequest(_error_payload("input_ids must be a list of ints or of lists"))
        if isinstance(text, str):
            return [self.tokenizer.encode(text, add_special_tokens=False)], True
        if isinstance(text, list) and all(isinstance(t, str) for t in text):
            return [self.tokenizer.encode(t, add_special_tokens=False) for t in text], False
        raise _BadRequest(_error_payload("Either text or input_ids should be provided."))

    async def _run(
        self, prompt: list[int], rid: str, params: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        started = time.monotonic()
        call = _Call(rid)
        self._calls.add(call)
        self.stats.rids_seen.append(rid)
        versions: list[str] = []
        out: list[int] = []
        finish: dict[str, Any] | None = None
        assert self._slots is not None
        try:
            self.stats.waiting += 1
            try:
                with anyio.CancelScope() as waiting:
                    abort_watch = anyio.create_task_group()
                    async with abort_watch:
                        abort_watch.start_soon(_cancel_on, call.aborted, waiting)
                        await self._slots.acquire()
                        abort_watch.cancel_scope.cancel()
            finally:
                self.stats.waiting -= 1
            if call.aborted.is_set():
                finish = {
                    "type": "abort",
                    "message": "Aborted",
                    "status_code": None,
                    "err_type": None,
                }
            else:
                try:
                    self.stats.running += 1
                    self.stats.max_running_seen = max(
                        self.stats.max_running_seen, self.stats.running
                    )
                    out, finish = await self._decode(prompt, call, params, versions)
                finally:
                    self.stats.running -= 1
                    self._slots.release()
        finally:
            self._calls.discard(call)
        return self._answer(prompt, out, finish, rid, params, body, versions, started)

    async def _decode(
        self, prompt: list[int], call: _Call, params: dict[str, Any], versions: list[str]
    ) -> tuple[list[int], dict[str, Any]]:
        policy = self.config.policy
        answer = policy.answer(self.tokenizer, prompt, params.get("sampling_seed"))
        max_new = params.get("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS)
        room = self.config.context_length - len(prompt)
        if room <= 0:
            return [], {"type": "length", "length": 0}
        max_new = min(max_new, room)
        stop_ids = set(params.get("stop_token_ids") or ())
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        ignore_eos = params.get("ignore_eos", False)
        out: list[int] = []
        latency = self.config.token_latency_s
        filler = 1000
        while True:
            if len(out) >= max_new:
                return out, {"type": "length", "length": len(out)}
            if latency > 0:
                with anyio.move_on_after(latency):
                    await call.aborted.wait()
            if call.aborted.is_set():
                abort = {
                    "type": "abort",
                    "message": "Aborted",
                    "status_code": None,
                    "err_type": None,
                }
                return out, abort
            position = len(out)
            token = answer[position] if position < len(answer) else filler + position
            out.append(token)
            versions.append(self.weight_version)
            self.stats.generated_tokens += 1
            if token in stop_ids or (token == self._eos and not ignore_eos):
                return out, {"type": "stop", "matched": token}
            if stops:
                text = self.tokenizer.decode(out, skip_special_tokens=False)
                for stop in stops:
                    if stop and stop in text:
                        return out, {"type": "stop", "matched": stop}

    def _answer(
        self,
        prompt: list[int],
        out: list[int],
        finish: dict[str, Any] | None,
        rid: str,
        params: dict[str, Any],
        body: dict[str, Any],
        versions: list[str],
        started: float,
    ) -> dict[str, Any]:
        text = self.tokenizer.decode(
            out, skip_special_tokens=params.get("skip_special_tokens", True)
        )
        matched = finish.get("matched") if finish and finish["type"] == "stop" else None
        if isinstance(matched, str) and matched in text and not params.get("no_stop_trim"):
            text = text[: text.find(matched)]  # SGLang drops a matched stop string
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "weight_version": versions[-1] if versions else self.weight_version,
            "num_retractions": 0,
        }
        if body.get("return_logprob"):
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [
                [token_logprob(i, t), t, None] for i, t in enumerate(out)
            ]
            meta["output_token_logprobs_length"] = len(out)
        meta.update(
            {
                "reasoning_tokens": 0,
                "completion_tokens": len(out),
                "cached_tokens": 0,
                "weight_versions": _spans(versions),
                "cached_tokens_details": None,
                "dp_rank": None,
                "e2e_latency": time.monotonic() - started,
                "response_sent_to_client_ts": time.time(),
            }
        )
        answer: dict[str, Any] = {"text": text, "output_ids": out, "meta_info": meta}
        if body.get("return_prompt_token_ids"):
            answer["prompt_token_ids"] = prompt
        return answer

    async def _stream(
        self,
        request: web.Request,
        job: tuple[list[int], str],
        params: dict[str, Any],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        # The whole answer, then cumulative chunks of it: enough for clients to parse the
        # SSE framing and the final chunk's finish_reason.
        prompt, rid = job
        answer = await self._run(prompt, rid, params, body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        out = answer["output_ids"]
        for end in range(1, len(out)):
            partial = dict(answer, output_ids=out[:end], text=self.tokenizer.decode(out[:end]))
            partial["meta_info"] = dict(
                answer["meta_info"], finish_reason=None, completion_tokens=end
            )
            await response.write(f"data: {json.dumps(partial)}\n\n".encode())
        await response.write(f"data: {json.dumps(answer)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

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
        load = {
            "dp_rank": 0,
            "num_running_reqs": self.stats.running,
            "num_waiting_reqs": self.stats.waiting,
            "num_used_tokens": 0,
        }
        return web.json_response(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                "version": "0.5.23",
                "accelerator": None,
                "num_accelerators": 1,
                "loads": [load],
            }
        )

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        new = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(new, str):
            return _error(400, "new_version must be a string")
        if body.get("abort_all_requests", False):
            self.abort(abort_all=True)
        self.weight_version = new
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {new}", "new_version": new}
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.model_path,
                "is_generation": True,
                "weight_version": self.weight_version,
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
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")


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
        if key in _BOOL_KEYS and not isinstance(value, bool):
            raise _BadRequest({"error": f"invalid type: `{key}` expected a boolean, got {value!r}"})
    return dict(params)


def _spans(versions: Sequence[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


def _error_payload(message: str) -> dict[str, Any]:
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response(_error_payload(message), status=status)
