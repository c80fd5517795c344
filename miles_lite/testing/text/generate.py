"""The text stand-in's ``POST /generate``: requests in, SGLang-shaped answers and streams out.

A request is checked (:mod:`.validate`), its prompts tokenized, then each prompt (times
``n``) runs as one :class:`~miles_lite.testing.text.scheduler.Call`: a batch slot from the
scheduler, tokens from :func:`~miles_lite.testing.text.decode.decode`. Answers are built
key for key in the order of the captures (``gen_*.json``): ``text``, ``output_ids``,
``meta_info`` (finish reason, token counts, weight version spans, log-prob triples when
asked); a streamed request gets cumulative SSE chunks as tokens are made
(``gen_stream.txt``). ``n > 1`` replaces every rid with a random one, as SGLang does. ``cached_tokens`` counts
the prompt tokens the stand-in's prefix cache holds under the request's ``extra_key``
(:mod:`~miles_lite.testing.text.prefix_cache`); a finished request's tokens go in it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
from aiohttp import web

from miles_lite.testing.text.decode import decode
from miles_lite.testing.text.policy import token_logprob
from miles_lite.testing.text.scheduler import Call, Scheduler
from miles_lite.testing.text.state import EngineState
from miles_lite.testing.text.validate import (
    BadRequest,
    check_generate_options,
    check_length,
    check_sampling,
    error_payload,
    generate_body,
    prompt_source,
)

__all__ = ["GenerateEndpoint", "error_response", "read_json", "sse"]


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; :class:`BadRequest` if it does not parse."""
    try:
        return json.loads(await request.read())
    except ValueError as exc:
        raise BadRequest(error_payload(f"invalid JSON body: {exc}")) from exc


def error_response(status: int, message: str) -> web.Response:
    """SGLang's error answer (:func:`error_payload`) with ``status``."""
    return web.json_response(error_payload(message, status), status=status)


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload)}\n\n".encode()


class GenerateEndpoint:
    """``/generate`` of one engine, and the runs the chat endpoint shares (:meth:`run_all`)."""

    def __init__(self, state: EngineState, scheduler: Scheduler) -> None:
        self.state = state
        self.scheduler = scheduler

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one ``POST /generate`` (the route's handler)."""
        state = self.state
        if state.warming():
            return error_response(503, "The server is not ready yet (warming up)")
        try:
            body = generate_body(await read_json(request))
            state.log_request(body)
            prompts, single = await self._prompts(body)
            params = check_sampling(body.get("sampling_params") or {})
            check_generate_options(body)
            for prompt in prompts:
                check_length(len(prompt), params, state.config.context_length)
        except BadRequest as bad:
            return web.json_response(bad.payload, status=400)
        n = params.get("n", 1)
        expanded = [prompt for prompt in prompts for _ in range(n)]
        rids = body.get("rid")
        rids = [rids] if isinstance(rids, str) else rids
        if n > 1 or not isinstance(rids, list) or len(rids) != len(expanded):
            # SGLang replaces every rid of an n > 1 request with a random one.
            rids = [uuid.uuid4().hex for _ in expanded]
        stream = bool(body.get("stream"))
        key = body.get("extra_key")
        calls = [
            (prompt, Call(str(rid), streaming=stream, cache_key=key))
            for prompt, rid in zip(expanded, rids, strict=True)
        ]
        if stream:
            return await self._stream(request, calls[0], params, body)
        answers = await self.run_all(calls, params, body)
        return web.json_response(answers[0] if single and len(answers) == 1 else answers)

    async def _prompts(self, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
        ids, texts, single = prompt_source(body)
        if ids is not None:
            return ids, single
        return [await self.state.encode(text) for text in texts], single

    async def run_all(
        self, calls: list[tuple[list[int], Call]], params: dict[str, Any], body: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Run each ``(prompt, call)`` side by side; their answers, in order."""
        if len(calls) == 1:
            return [await self.run(*calls[0], params, body)]
        answers: list[Any] = [None] * len(calls)

        async def run(i: int, prompt: list[int], call: Call) -> None:
            answers[i] = await self.run(prompt, call, params, body)

        async with anyio.create_task_group() as tg:
            for i, (prompt, call) in enumerate(calls):
                tg.start_soon(run, i, prompt, call)
        return answers

    async def run(
        self, prompt: list[int], call: Call, params: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        """Generate for one call (a slot, then its tokens); its whole answer."""
        started = time.monotonic()
        state = self.state
        state.stats.log_rid(call.rid, state.config.request_log_limit)
        versions: list[str] = []

        async def generate() -> dict[str, Any]:
            return await decode(state, self.scheduler, prompt, call, params, versions)

        finish = await self.scheduler.run(call, generate)
        if finish.get("type") != "abort":
            state.cache.insert(call.cache_key, [*prompt, *call.out])
        return self.answer(
            prompt,
            call.out,
            finish,
            call.rid,
            params,
            body,
            versions,
            started,
            call.logprobs,
            cached_tokens=call.cached_tokens,
        )

    def answer(
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
        cached_tokens: int = 0,
    ) -> dict[str, Any]:
        """The answer in SGLang's key order; ``started`` None for a non-final stream chunk."""
        state = self.state
        text = state.decode(out, skip_special_tokens=params.get("skip_special_tokens", True))
        matched = finish.get("matched") if finish and finish["type"] == "stop" else None
        if isinstance(matched, str) and not params.get("no_stop_trim") and matched in text:
            text = text[: text.rfind(matched)]  # SGLang drops a matched stop string
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(prompt),
            "weight_version": versions[-1] if versions else state.weight_version,
            "num_retractions": 0,
        }
        if body.get("return_logprob"):
            meta.update(self._logprobs(prompt, out, logprobs, body))
        meta.update(
            {"reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": cached_tokens}
        )
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

    def _logprobs(
        self,
        prompt: list[int],
        out: list[int],
        logprobs: Sequence[float],
        body: dict[str, Any],
    ) -> dict[str, Any]:
        """The log-prob keys of ``meta_info``, in SGLang's order."""
        with_text = bool(body.get("return_text_in_logprobs"))
        start = body.get("logprob_start_len", -1)
        meta: dict[str, Any] = {}
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
        return meta

    def _piece(self, token: int, with_text: bool) -> str | None:
        return self.state.decode([token], skip_special_tokens=False) if with_text else None

    async def _stream(
        self,
        request: web.Request,
        job: tuple[list[int], Call],
        params: dict[str, Any],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        # Cumulative chunks as tokens are made (captures/gen_stream.txt): an abort
        # mid-stream ends it with the partial output and finish type abort. As SGLang's,
        # the first chunk holds the first token, then one chunk every stream_interval.
        prompt, call = job
        interval = params.get("stream_interval") or 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        final: dict[str, Any] = {}
        sent = 0
        first = True

        async def run() -> None:
            final.update(await self.run(prompt, call, params, body))
            call.advanced()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not final:
                progress = call.progress
                assert progress is not None  # a streaming call
                if len(call.out) > sent and (sent == 0 or len(call.out) - sent >= interval):
                    sent = len(call.out)
                    chunk = self.answer(
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
                        cached_tokens=call.cached_tokens,
                    )
                    await response.write(sse(chunk))
                    first = False
                    continue
                await progress.wait()
        final["meta_info"].pop("response_sent_to_client_ts", None)
        await response.write(sse(final))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _spans(versions: Sequence[str]) -> list[dict[str, Any]]:
    """The weight versions of an answer's tokens as ``{version, start, end}`` runs."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans
