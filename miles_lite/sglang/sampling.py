"""Sampling parameters of SGLang ``/generate``: exactly the keys it accepts, checked early.

SGLang validates ``sampling_params`` strictly (an unknown key is a 400), so a typo
(``max_tokens``, ``seed``) is refused here, before anything is sent, naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from miles_lite.errors import SamplingParamsError

__all__ = [
    "CHAT_NAMES",
    "CHAT_REFUSED",
    "CHAT_TEXT_ONLY",
    "SAMPLING_KEYS",
    "TextSamplingParams",
    "chat_request_kwargs",
    "chat_sampling",
    "check_sampling_keys",
    "check_sampling_params",
]

#: The keys SGLang 0.5.23 accepts in ``sampling_params``, in the order its 400 lists them.
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
_KEY_SET = frozenset(SAMPLING_KEYS)
_HINTS = {"max_tokens": "max_new_tokens", "seed": "sampling_seed", "stop_sequences": "stop"}

#: ``/generate`` sampling keys and their names on ``/v1/chat/completions`` (SGLang's chat
#: endpoint takes OpenAI's names and these extras). The one map: the session server
#: applies the rollout's sampling through it (:func:`chat_sampling`), and agents get it
#: through :func:`chat_request_kwargs`. Every key of :data:`SAMPLING_KEYS` is here, in
#: :data:`CHAT_TEXT_ONLY` or in :data:`CHAT_REFUSED`.
CHAT_NAMES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "ignore_eos": "ignore_eos",
    "logit_bias": "logit_bias",
    "n": "n",
}
#: Keys that shape only the text of an answer or how it streams, never its token ids or
#: log-probs (the training data): chat turns keep the chat endpoint's own handling, since
#: the message content must be what the template renders back, or the next turn's
#: prompt would not extend the trajectory. Accepted in a rollout with chat turns, not
#: sent on them.
CHAT_TEXT_ONLY = frozenset(
    {"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens", "stream_interval"}
)
#: Keys that change the tokens but that SGLang's chat endpoint does not take (or takes
#: only in another shape): a rollout whose chat turns would need them is refused when it
#: is opened (:func:`chat_sampling`), never run with them dropped.
CHAT_REFUSED = frozenset(SAMPLING_KEYS) - set(CHAT_NAMES) - CHAT_TEXT_ONLY
#: The chat names the ``openai`` client takes as keyword arguments; the others go in its
#: ``extra_body``.
_OPENAI_ARGUMENTS = frozenset(
    {
        "max_tokens",
        "seed",
        "temperature",
        "top_p",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "n",
    }
)


def chat_sampling(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The rollout's ``/generate`` sampling params under their ``/v1/chat/completions``
    names (:data:`CHAT_NAMES`), what every chat turn is sent with; text-only keys
    (:data:`CHAT_TEXT_ONLY`) are left out.

    Raises :class:`~miles_lite.errors.SamplingParamsError` naming the first key chat
    turns cannot carry (:data:`CHAT_REFUSED`, or one SGLang does not know): a rollout's
    sampling reaches every turn or the rollout is refused.
    """
    out: dict[str, Any] = {}
    for key, value in sampling_params.items():
        name = CHAT_NAMES.get(key)
        if name is not None:
            out[name] = value
        elif key not in CHAT_TEXT_ONLY:
            known = key in _KEY_SET
            raise SamplingParamsError(
                f"sampling key {key!r} cannot reach chat turns: SGLang's"
                f" /v1/chat/completions {'does not take it' if known else 'does not know it'};"
                f" chat turns carry {sorted(CHAT_NAMES)} (text-only keys"
                f" {sorted(CHAT_TEXT_ONLY)} are accepted and not sent). Remove it from the"
                " rollout's sampling, or generate with /generate instead of an agent"
            )
    return out


def chat_request_kwargs(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The rollout's ``/generate`` sampling params as keyword arguments of
    ``openai.AsyncOpenAI().chat.completions.create``: OpenAI's names at the top
    (``max_new_tokens`` -> ``max_tokens``, ...), SGLang's extras (``top_k``, ``min_p``,
    ...) under ``extra_body``; keys chat does not take are left out."""
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in sampling_params.items():
        name = CHAT_NAMES.get(key)
        if name is not None:
            (kwargs if name in _OPENAI_ARGUMENTS else extra)[name] = value
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def check_sampling_keys(params: Mapping[str, Any]) -> None:
    """Raise :class:`SamplingParamsError` unless every key of ``params`` is one SGLang
    accepts and ``n`` is 1 (see :func:`check_sampling_params`); one set comparison when
    they are (the per-request check)."""
    if params.keys() <= _KEY_SET and params.get("n", 1) == 1:
        return
    check_sampling_params(params)


def check_sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``params`` if every key is one SGLang accepts.

    Raises :class:`~miles_lite.errors.SamplingParamsError` naming the first unknown key
    (and the right name for common mix-ups such as ``max_tokens``), or for ``n`` other
    than 1: a group is ``n`` single requests, each with its own abortable rid.
    """
    for key in params:
        if key not in SAMPLING_KEYS:
            hint = f" (did you mean {_HINTS[key]!r}?)" if key in _HINTS else ""
            raise SamplingParamsError(
                f"unknown sampling key {key!r}{hint}; SGLang accepts {list(SAMPLING_KEYS)}"
            )
    if params.get("n", 1) != 1:
        raise SamplingParamsError(
            f"sampling key 'n' must be 1, got {params['n']!r}: SGLang replaces the rids of an"
            " n > 1 request, so it could not be aborted; use n_samples_per_prompt instead"
        )
    return dict(params)


#: SGLang's ranges of the numeric keys ``extra`` may carry: (what is allowed, the check,
#: int or float).
_EXTRA_RANGES: dict[str, tuple[str, Callable[[float], bool], type]] = {
    "min_p": ("in [0, 1]", lambda v: 0 <= v <= 1, float),
    "frequency_penalty": ("in [-2, 2]", lambda v: -2 <= v <= 2, float),
    "presence_penalty": ("in [-2, 2]", lambda v: -2 <= v <= 2, float),
    "repetition_penalty": ("in [0, 2]", lambda v: 0 <= v <= 2, float),
    "min_new_tokens": (">= 0", lambda v: v >= 0, int),
}


def _check_number(
    name: str, value: object, allowed: str, check: Callable[[float], bool], kind: type = float
) -> None:
    """A finite number (an int when ``kind`` is int; never a bool) for which ``check``
    holds; :class:`SamplingParamsError` naming the field, the rule and the value."""
    kinds = (int,) if kind is int else (int, float)
    ok = (
        isinstance(value, kinds)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and check(value)
    )
    if not ok:
        what = "an int" if kind is int else "a finite number"
        raise SamplingParamsError(
            f"TextSamplingParams.{name} must be {what} {allowed}, got {value!r}"
        )


def _check_list(name: str, value: object, kind: type) -> None:
    """None, or a list (or tuple) of ``kind`` (never a bool)."""
    if value is None:
        return
    if not isinstance(value, list | tuple) or not all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    ):
        raise SamplingParamsError(
            f"TextSamplingParams.{name} must be None or a list of {kind.__name__}, got {value!r}"
        )


@dataclass(frozen=True, kw_only=True)
class TextSamplingParams:
    """The rollout's default sampling parameters, with miles' defaults.

    ``None`` fields are not sent (the engine's defaults apply). ``no_stop_trim`` is on so
    that the text keeps the stop string the output ids hold; ``extra`` carries any other
    SGLang key (checked). Usage: ``TextSamplingParams(max_new_tokens=1024, temperature=0.8)``.
    """

    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = False
    no_stop_trim: bool = True
    spaces_between_special_tokens: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # SGLang's own checks (SamplingParams.verify), here so that a bad value fails when
        # the object is built, naming the field, instead of every sample (or none) at the
        # engine; max_new_tokens 0 is refused too: a rollout sample must have an output.
        _check_number("max_new_tokens", self.max_new_tokens, ">= 1", lambda v: v >= 1, int)
        _check_number("temperature", self.temperature, ">= 0", lambda v: v >= 0)
        _check_number("top_p", self.top_p, "in (0, 1]", lambda v: 0 < v <= 1)
        _check_number("top_k", self.top_k, "-1 or >= 1", lambda v: v == -1 or v >= 1, int)
        _check_list("stop", self.stop, str)
        _check_list("stop_token_ids", self.stop_token_ids, int)
        for name in ("skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise SamplingParamsError(
                    f"TextSamplingParams.{name} must be a bool, got {getattr(self, name)!r}"
                )
        if not isinstance(self.extra, dict):
            raise SamplingParamsError(
                f"TextSamplingParams.extra must be a dict, got {self.extra!r}"
            )
        clash = {f.name for f in fields(self)} & set(self.extra)
        if clash:
            raise SamplingParamsError(f"TextSamplingParams.extra repeats fields {sorted(clash)}")
        check_sampling_params(self.extra)
        for key, (allowed, check, kind) in _EXTRA_RANGES.items():
            if key in self.extra:
                _check_number(f"extra[{key!r}]", self.extra[key], allowed, check, kind)
        low = self.extra.get("min_new_tokens", 0)
        if low > self.max_new_tokens:
            raise SamplingParamsError(
                f"TextSamplingParams.extra['min_new_tokens'] ({low}) must be <= max_new_tokens"
                f" ({self.max_new_tokens})"
            )

    def to_payload(self) -> dict[str, Any]:
        """The ``sampling_params`` of a request: a fresh dict, ``None`` fields left out."""
        payload = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "extra" and getattr(self, f.name) is not None
        }
        payload.update(self.extra)
        for key in ("stop", "stop_token_ids"):
            if key in payload:
                payload[key] = list(payload[key])
        return payload
