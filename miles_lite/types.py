"""Samples and their parts, named as in miles so that code written for miles reads naturally."""

from __future__ import annotations

import enum
import functools
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

if TYPE_CHECKING:
    import torch

    from miles_lite.errors import MilesLiteError

__all__ = [
    "DiTTrajectory",
    "PrefixCacheInfo",
    "Sample",
    "SampleStatus",
    "SessionInfo",
    "WeightSpan",
    "checked_token_ids",
]


class SampleStatus(str, enum.Enum):
    """Where a sample stands: the names of miles' ``Sample.Status``."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(slots=True)
class DiTTrajectory:
    """The denoising path of one diffusion sample.

    ``latents`` is ``[T+1, ...]`` (the final state included), ``timesteps`` ``[T]``,
    ``sigmas`` ``[T+1]`` (absent from engines that speak the older JSON form).
    """

    latents: torch.Tensor | None = None
    timesteps: torch.Tensor | None = None
    sigmas: torch.Tensor | None = None


@dataclass(slots=True)
class PrefixCacheInfo:
    """Prompt tokens the engine found in its prefix cache, summed over a sample's requests
    (``meta_info.cached_tokens`` / ``prompt_tokens``, as miles' ``prefix_cache_info``)."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Cached share of the prompt tokens sent (0.0 before any request)."""
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class WeightSpan:
    """The policy version that made the response tokens ``[start, end)`` of a sample
    (offsets in the response, as SGLang's ``meta_info.weight_versions`` gives them per
    request).

    ``kv_version``: set when these tokens were made on context (KV) computed by an older
    version: the request went on across a weight update that kept its KV (an
    ``in_place`` pause, or no cache flush); it names the oldest version whose KV was in
    the context. ``None``: the context was computed by ``version`` itself.
    """

    version: str
    start: int
    end: int
    kv_version: str | None = None


@dataclass(slots=True)
class SessionInfo:
    """The chat session an agentic sample came from: its ``id``, the ``turns`` recorded in
    it, and ``tito_mismatches``: turns whose prompt did not extend the tokens so far (each
    started a new sample)."""

    id: str
    turns: int = 0
    tito_mismatches: int = 0


@dataclass(kw_only=True)
class Sample:
    """One rollout sample: a prompt, what the engine made of it, and its reward.

    Text fields (``tokens``, ``response_length``, ``loss_mask``, ...) and diffusion fields
    (``generated_output``, ``dit_trajectory``, ...) live side by side, as in miles. Diffusion
    tensors may view shared memory owned by a parser pool's arena: they stay valid as long
    as they are referenced. The arena space of one response (a microgroup) is freed once no
    tensor of any of its samples is referenced: :meth:`detach_tensors` copies this
    sample's tensors out; detach (or drop) every sample of the response to free it.
    """

    index: int = 0
    group_index: int = 0
    prompt: str | list[dict[str, Any]] = ""
    label: Any = None
    status: SampleStatus = SampleStatus.PENDING
    reward: float | dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The typed error that made this sample FAILED, else None.
    error: MilesLiteError | None = None

    # text
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | torch.Tensor | None = None
    #: The weight version of each request the sample made (miles' field).
    weight_versions: list[str] = field(default_factory=list)
    #: Which policy version made which response tokens (tool and template tokens are
    #: in no span).
    weight_spans: list[WeightSpan] = field(default_factory=list)
    #: The engine's finish reason of the sample's last request (``stop``, ``length``,
    #: ``abort``, ``tool_calls``), and the stop string or token id it matched.
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    #: Why the sample ended TRUNCATED or ABORTED when it was not the engine's doing:
    #: ``prompt_too_long``, ``context_full``, ``budget_spent``, ``max_turns``,
    #: ``early_stop``, ``no_records``, ``all_truncated``.
    status_reason: str | None = None
    #: Tool turns taken (multi-turn tool calling).
    turns: int = 0
    #: The chat session of an agentic sample.
    session: SessionInfo | None = None
    #: Raw media of a multimodal prompt (``{"images": [PIL images or data URLs]}``) and
    #: what the processor made of them for training (``pixel_values``, ``image_grid_thw``).
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    #: Wall time spent outside the engine (tools, environments), in seconds.
    non_generation_time: float = 0.0
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    # diffusion
    seed: int | None = None
    request_id: str | None = None
    generated_output: torch.Tensor | None = None
    rollout_debug_tensors: dict[str, Any] | None = None
    denoising_env: dict[str, Any] | None = None
    dit_trajectory: DiTTrajectory | None = None
    inference_time_s: float | None = None
    peak_memory_mb: float | None = None

    @property
    def effective_response_length(self) -> int:
        """The model's own tokens in the response: ``sum(loss_mask)`` (tool output and
        template text between turns have mask 0), or ``response_length`` without a mask.
        The one length the ``rollout/response_len/*`` metrics use, as miles does."""
        if self.loss_mask is None:
            return self.response_length
        return sum(self.loss_mask)

    def fail(self, error: MilesLiteError) -> None:
        """Mark this sample FAILED because of ``error`` (kept in ``self.error``)."""
        self.status = SampleStatus.FAILED
        self.error = error

    def validate(self, *, vocab_size: int | None = None) -> None:
        """Check a text sample before it becomes training data (miles' ``Sample.validate``,
        and the values).

        Lengths: ``len(tokens) >= response_length``, and each per-token list
        (``loss_mask``, ``rollout_log_probs``) that is set has exactly ``response_length``
        entries. Values: ``tokens`` are ints (in ``[0, vocab_size)`` when given), the mask
        is 0/1, log-probs are finite and <= 0, and 0.0 under mask 0; weight spans lie
        within the response. Runs at C speed. Raises
        :class:`~miles_lite.errors.SampleInvariantError` naming every violation.
        """
        problems = _text_problems(self, vocab_size)
        if problems:
            from miles_lite.errors import SampleInvariantError

            raise SampleInvariantError(
                f"sample {self.index}: " + "; ".join(problems), request_id=self.request_id
            )

    def detach_tensors(self) -> None:
        """Replace every diffusion tensor by a private copy: this sample no longer holds its
        response's arena space (freed once no sample of the response holds it)."""
        self.generated_output = _clone(self.generated_output)
        self.rollout_log_probs = _clone(self.rollout_log_probs)
        self.rollout_debug_tensors = _clone(self.rollout_debug_tensors)
        self.denoising_env = _clone(self.denoising_env)
        if self.dit_trajectory is not None:
            t = self.dit_trajectory
            self.dit_trajectory = DiTTrajectory(
                latents=_clone(t.latents), timesteps=_clone(t.timesteps), sigmas=_clone(t.sigmas)
            )


def _clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


@functools.lru_cache(maxsize=8)
def _token_ids(vocab_size: int | None) -> Any:
    """The type of a list of token ids (ints, not bools, in ``[0, vocab_size)``), for
    ``msgspec.convert``: checked at C speed, 3-4x faster than a type set plus min/max."""
    bound = msgspec.Meta(ge=0) if vocab_size is None else msgspec.Meta(ge=0, lt=vocab_size)
    return list[Annotated[int, bound]]


def checked_token_ids(
    tokens: Sequence[int], vocab_size: int | None = None, *, name: str = "tokens"
) -> list[int]:
    """A new list of ``tokens``, checked as :meth:`Sample.validate` checks a sample's
    (ints, not bools, in ``[0, vocab_size)``), for the price of the copy. Raises
    :class:`~miles_lite.errors.SampleInvariantError` naming the first bad id (as
    ``name[i]``)."""
    try:
        return msgspec.convert(tokens, _token_ids(vocab_size))  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        from miles_lite.errors import SampleInvariantError

        raise SampleInvariantError(_bad_token(tokens, vocab_size, exc, name)) from None


def _bad_token(
    tokens: Any, vocab_size: int | None, exc: msgspec.ValidationError, name: str = "tokens"
) -> str:
    """The first token that is not an id, named for the error (``exc``: msgspec's words,
    where no single token is to blame)."""
    bad = next(
        (
            (i, t)
            for i, t in enumerate(tokens)
            if not isinstance(t, int)
            or isinstance(t, bool)
            or t < 0
            or (vocab_size is not None and t >= vocab_size)
        ),
        None,
    )
    if bad is None:
        return f"{name} is not a list of ids in [0, {vocab_size}): {exc}"
    return f"{name}[{bad[0]}] is {bad[1]!r}, not an id in [0, {vocab_size})"


def _text_problems(sample: Sample, vocab_size: int | None) -> list[str]:
    n = sample.response_length
    problems = []
    if type(n) is not int or n < 0:
        return [f"response_length is {n!r}, not an int >= 0"]
    tokens = sample.tokens
    if len(tokens) < n:
        problems.append(f"tokens has {len(tokens)} entries < response_length {n}")
    if tokens:
        try:
            msgspec.convert(tokens, _token_ids(vocab_size))
        except msgspec.ValidationError as exc:
            problems.append(_bad_token(tokens, vocab_size, exc))
    mask, log_probs = sample.loss_mask, sample.rollout_log_probs
    for name, value in (("loss_mask", mask), ("rollout_log_probs", log_probs)):
        if value is not None and len(value) != n:
            problems.append(f"{name} has {len(value)} entries, response_length is {n}")
    if mask is not None and not set(mask) <= {0, 1}:
        problems.append(f"loss_mask holds {sorted(set(mask) - {0, 1})[:3]}, not only 0 and 1")
    if isinstance(log_probs, list) and log_probs:
        if not set(map(type, log_probs)) <= {float, int}:
            problems.append("rollout_log_probs holds values that are not numbers")
        elif not (math.isfinite(sum(log_probs)) and max(log_probs) <= 0.0):
            bad_lp = next((i, v) for i, v in enumerate(log_probs) if not math.isfinite(v) or v > 0)
            problems.append(
                f"rollout_log_probs[{bad_lp[0]}] is {bad_lp[1]!r}, not a finite value <= 0"
            )
        elif (
            mask is not None
            and len(mask) == len(log_probs)
            and any(itertools.compress(log_probs, map(operator.not_, mask)))
        ):
            problems.append("rollout_log_probs is not 0.0 where loss_mask is 0")
    for span in sample.weight_spans:
        if not 0 <= span.start <= span.end <= n:
            problems.append(f"weight span {span} lies outside the response of {n} tokens")
            break
    return problems
