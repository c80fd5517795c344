"""Requests the text stand-in refuses, with SGLang 0.5.23's statuses and words.

Pure checks over decoded JSON; each refusal raises :class:`BadRequest` (``/generate``'s
400 body in ``payload``) or :class:`ChatBadRequest` (the OpenAI-style 400 of
``/v1/chat/completions``). The sampling keys are the stand-in's own list
(:data:`SAMPLING_KEYS`, checked against a capture of the real server's 400 by
``tests/testing/test_text_validate.py``): the stand-in is an oracle for the library, so
it does not share the library's list.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SAMPLING_KEYS",
    "BadRequest",
    "ChatBadRequest",
    "chat_error",
    "check_generate_options",
    "check_length",
    "check_sampling",
    "error_payload",
    "generate_body",
    "is_int",
    "prompt_source",
]

#: The keys SGLang 0.5.23 accepts in ``sampling_params``, in the order its 400 lists them
#: (``tests/data/sglang_captures/gen_bad_sampling_key.txt``).
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
_FLOAT_KEYS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)


class BadRequest(Exception):
    """A ``/generate`` request SGLang answers with 400; ``payload`` is its JSON body."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload)
        self.payload = payload


class ChatBadRequest(Exception):
    """A chat request SGLang answers with 400; ``payload`` is its JSON error body."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.payload = {
            "object": "error",
            "message": message,
            "type": "BadRequest",
            "param": None,
            "code": 400,
        }


def error_payload(message: str, status: int = 400) -> dict[str, Any]:
    """SGLang's error body for ``status`` (400 or 503) with ``message``."""
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request" if status == 400 else "Service Unavailable",
        "param": None,
        "code": status,
    }


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int and not a bool (an int subclass)."""
    return type(value) is int


def generate_body(body: Any) -> dict[str, Any]:
    """``body`` if it is a JSON object, as ``/generate`` needs."""
    if not isinstance(body, dict):
        raise BadRequest(
            error_payload(
                "1 validation error: Input should be a dictionary or an instance of"
                " GenerateReqInput"
            )
        )
    return body


def check_sampling(params: Any) -> dict[str, Any]:
    """A copy of ``sampling_params`` if SGLang takes it: known keys, right types."""
    if not isinstance(params, dict):
        raise BadRequest({"error": f"invalid type: expected a map, got {type(params).__name__}"})
    for key, value in params.items():
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise BadRequest({"error": f"unknown field `{key}`, expected one of {expected}"})
        if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadRequest({"error": f"invalid type: `{key}` expected an integer, got {value!r}"})
        if key in _FLOAT_KEYS and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise BadRequest({"error": f"invalid type: `{key}` expected a number, got {value!r}"})
        if key == "stop" and not (
            isinstance(value, str)
            or (isinstance(value, list) and all(isinstance(s, str) for s in value))
        ):
            raise BadRequest(
                {"error": f"invalid type: `stop` expected a string or a list, got {value!r}"}
            )
        if key == "stop_token_ids" and not (
            isinstance(value, list) and all(is_int(i) for i in value)
        ):
            raise BadRequest(
                {"error": f"invalid type: `stop_token_ids` expected a list, got {value!r}"}
            )
        if key in _BOOL_KEYS and not isinstance(value, bool):
            raise BadRequest({"error": f"invalid type: `{key}` expected a boolean, got {value!r}"})
    return dict(params)


def check_generate_options(body: dict[str, Any]) -> None:
    """The types of ``/generate``'s own options (log-probs, stream, rid, extra_key)."""
    for key in ("return_logprob", "return_text_in_logprobs", "return_prompt_token_ids", "stream"):
        if key in body and not isinstance(body[key], bool):
            raise BadRequest({"error": f"invalid type: `{key}` expected a boolean"})
    for key in ("logprob_start_len", "top_logprobs_num"):
        if key in body and body[key] is not None and not is_int(body[key]):
            raise BadRequest({"error": f"invalid type: `{key}` expected an integer"})
    extra_key = body.get("extra_key")
    if extra_key is not None and not isinstance(extra_key, str):
        raise BadRequest({"error": "invalid type: `extra_key` expected a string"})
    rid = body.get("rid")
    if (
        rid is not None
        and not isinstance(rid, str)
        and not (isinstance(rid, list) and all(isinstance(r, str) for r in rid))
    ):
        raise BadRequest({"error": "invalid type: `rid` expected a string or a list of strings"})


def check_length(prompt_tokens: int, params: dict[str, Any], context: int) -> None:
    """SGLang's own checks and words (``TokenizerManager``): the prompt, and the prompt
    plus ``max_new_tokens`` when given, must stay below the context length."""
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
    raise BadRequest({"error": {"message": message}})


def prompt_source(body: dict[str, Any]) -> tuple[list[list[int]] | None, list[str], bool]:
    """The prompts of a ``/generate`` body, before any tokenizing.

    Returns ``(ids, texts, single)``: the prompts as token id lists (``input_ids``, then
    ``texts`` is empty) or as texts to tokenize (``ids`` is None), and whether the request
    named one prompt (answered with an object) or a batch (answered with a list).
    """
    ids = body.get("input_ids")
    text = body.get("text")
    if ids is not None:
        if isinstance(ids, list) and ids and all(is_int(i) for i in ids):
            return [list(ids)], [], True
        if (
            isinstance(ids, list)
            and ids
            and all(isinstance(p, list) and p and all(is_int(i) for i in p) for p in ids)
        ):
            return [list(p) for p in ids], [], False
        raise BadRequest(
            error_payload("input_ids must be a non-empty list of ints or of such lists")
        )
    if isinstance(text, str):
        return None, [text], True
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return None, list(text), False
    raise BadRequest(error_payload("Either text or input_ids should be provided."))


def chat_error(bad: BadRequest) -> dict[str, Any]:
    """A ``/generate`` refusal as the chat endpoint words it."""
    message = bad.payload.get("error") or bad.payload.get("message")
    if isinstance(message, dict):
        message = message.get("message")
    return ChatBadRequest(str(message)).payload
