"""How the text stand-in behaves (:class:`TextStandInConfig`), and the SGLang release it mirrors."""

from __future__ import annotations

from dataclasses import dataclass, field

from miles_lite.testing.text.model import TinyModelPolicy
from miles_lite.testing.text.policy import TextPolicy

__all__ = ["SGLANG_VERSION", "TextStandInConfig"]

#: The SGLang release whose answers this stand-in mirrors.
SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True, kw_only=True)
class TextStandInConfig:
    """How the text stand-in behaves. Times in seconds.

    Usage: ``TextStandInConfig(token_latency_s=0.01, policy=TextPolicy(rules=[...]))``.

    ``policy``: what it answers (scripted, or :class:`TinyModelPolicy`). ``token_latency_s``: time per output token.
    ``max_running``: batch slots (more requests wait). ``context_length``: prompt plus
    output tokens at most. ``warmup_s``: ``/health``, ``/health_generate``, ``/generate``
    and chat answer 503 for this long after start. ``model_path`` and ``weight_version``:
    what the model endpoints report. ``update_latency_s``: how long
    ``/update_weights_from_disk`` takes before it loads (a checkpoint read: long enough to
    kill the engine mid-update). ``request_log_limit``: how many request bodies and
    rids the statistics keep. A bad value raises :class:`ValueError` naming the field.
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
    update_latency_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("token_latency_s", "warmup_s", "update_latency_s"):
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
