"""What the text stand-in generates for one request, token by token, and why it stops.

The tokens come from the config's policy: the scripted :class:`~miles_lite.testing.TextPolicy`
(its whole answer is known up front, then filler tokens) or the tiny model (one forward
step per token, in a worker thread). The sampling params decide the end, as SGLang does:
``max_new_tokens`` (default 128, capped by the context), ``min_new_tokens`` (no EOS or
stop id before), stop token ids, EOS unless ``ignore_eos``, stop strings (found in a
decoded tail window). The scheduler paces each token (:meth:`Scheduler.pace`).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread

from miles_lite.testing.text.policy import TextPolicy
from miles_lite.testing.text.scheduler import ABORT, Call, Scheduler
from miles_lite.testing.text.state import EngineState

__all__ = ["decode"]

_DEFAULT_MAX_NEW_TOKENS = 128
#: Where tokens past the end of a scripted answer come from (ordinary BPE tokens).
_FILLER = 1000
#: Tokens decoded to look for a stop string: longer than any stop string a test uses.
_STOP_WINDOW = 32


async def decode(
    state: EngineState,
    scheduler: Scheduler,
    prompt: list[int],
    call: Call,
    params: dict[str, Any],
    versions: list[str],
) -> dict[str, Any]:
    """Make ``call.out`` token by token (each token's weight version into ``versions``);
    returns the finish reason in SGLang's form."""
    model, answer = state.model, []
    step: Any = None
    temperature = 1.0
    if model is not None:
        step = model.start(prompt, params.get("sampling_seed"), call.rid)
        temperature = float(params.get("temperature", 1.0))
    else:
        policy = state.config.policy
        assert isinstance(policy, TextPolicy)
        answer = policy.answer(state.tokenizer, prompt, params.get("sampling_seed"), call.rid)
    max_new = params.get("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS)
    max_new = min(max_new, state.config.context_length - len(prompt))
    min_new = params.get("min_new_tokens", 0)
    stop_ids = set(params.get("stop_token_ids") or ())
    stops = params.get("stop") or []
    stops = [s for s in ([stops] if isinstance(stops, str) else stops) if s]
    ignore_eos = params.get("ignore_eos", False)
    out = call.out
    first = True
    while True:
        if len(out) >= max(max_new, 0):
            return {"type": "length", "length": len(out)}
        if not await scheduler.pace(call):
            return dict(ABORT)
        if first:
            # Looked up once it really starts (a request sent while paused waits first).
            call.cached_tokens = state.cache.match(call.cache_key, prompt)
            first = False
        if call.retracted_at is not None:
            if model is not None and scheduler.flushes != call.retracted_at:
                # Its KV was flushed while retracted: recomputed by the current weights.
                step["past"] = None
                step["pending"] = [*prompt, *out]
            call.retracted_at = None
        position = len(out)
        logprob = 0.0
        # The version of the weights this step runs with (an update may land during it).
        version = state.weight_version
        if model is not None:
            weights = model.model
            token, logprob = await anyio.to_thread.run_sync(model.step, step, temperature, weights)
            if call.aborted.is_set():
                return dict(ABORT)
        else:
            token = answer[position] if position < len(answer) else _FILLER + position % 20000
        if position < min_new and (token == state.eos or token in stop_ids):
            token = _FILLER + position  # a model cannot end before min_new_tokens
            if model is not None:
                step["pending"] = [token]
        if model is not None:
            call.logprobs.append(logprob)
        out.append(token)
        versions.append(version)
        state.stats.generated_tokens += 1
        call.advanced()
        if position + 1 < min_new:
            continue
        if token in stop_ids or (token == state.eos and not ignore_eos):
            return {"type": "stop", "matched": token}
        if stops:
            # Only the tail can hold a new match: decode a bounded window.
            tail = state.decode(out[-_STOP_WINDOW:], skip_special_tokens=False)
            for stop in stops:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
