"""Samples and their parts, named as in miles so that code written for miles reads naturally."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from miles_lite.errors import MilesLiteError

__all__ = ["DiTTrajectory", "PrefixCacheInfo", "Sample", "SampleStatus"]


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
    weight_versions: list[str] = field(default_factory=list)
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

    def fail(self, error: MilesLiteError) -> None:
        """Mark this sample FAILED because of ``error`` (kept in ``self.error``)."""
        self.status = SampleStatus.FAILED
        self.error = error

    def validate(self) -> None:
        """Check the text invariants (miles' ``Sample.validate``).

        ``len(tokens) >= response_length``, and each per-token list (``loss_mask``,
        ``rollout_log_probs``) that is set has exactly ``response_length`` entries.
        Raises :class:`~miles_lite.errors.SampleInvariantError` naming every violation.
        """
        from miles_lite.errors import SampleInvariantError

        n = self.response_length
        problems = []
        if n < 0:
            problems.append(f"response_length is {n} < 0")
        if len(self.tokens) < n:
            problems.append(f"tokens has {len(self.tokens)} entries < response_length {n}")
        for name in ("loss_mask", "rollout_log_probs"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                problems.append(f"{name} has {len(value)} entries, response_length is {n}")
        if problems:
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
