"""A second policy for the text stand-in: a tiny random-weight Qwen2 model (real log-probs).

Usage::

    TextStandInConfig(policy=TinyModelPolicy(seed=0))

The model (hidden size 32, 2 layers, the Qwen3 tokenizer's vocabulary, about 5 M
parameters) is built from a config, seeded, on the CPU, without touching torch's global
random state; it builds in about a second. Each output token is one forward step with a
KV cache, run in a worker thread (torch releases the GIL), sampled with a generator seeded
from (``seed``, the request's ``sampling_seed`` or else its rid, the prompt), at the
request's ``temperature`` (0 is greedy). The reported log-prob of a token is the model's
``log_softmax`` at temperature 1, so a test can recompute it with :meth:`TinyModel.logprobs`.

``/update_weights_from_disk`` loads a ``save_pretrained`` folder of the same architecture
(:meth:`TinyModel.load`): a new module takes the old one's place between two steps, so
each step runs wholly with one version's weights; requests in flight keep their KV.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TinyModel", "TinyModelPolicy"]


@dataclass(frozen=True, kw_only=True)
class TinyModelPolicy:
    """How the tiny model is built: ``seed`` for its weights and sampling, its size."""

    seed: int = 0
    hidden_size: int = 32
    num_layers: int = 2

    def __post_init__(self) -> None:
        for name in ("seed", "hidden_size", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TinyModelPolicy.{name} must be an int >= 0, got {value!r}")
        if self.hidden_size < 8 or self.hidden_size % 4:
            raise ValueError(
                f"TinyModelPolicy.hidden_size must be a multiple of 4 >= 8, got {self.hidden_size}"
            )

    def build(self, vocab_size: int, context_length: int) -> TinyModel:
        """The model (blocking: about a second; call it from a worker thread)."""
        return TinyModel(self, vocab_size, context_length)


class TinyModel:
    """The built model and its per-request decoding state (see the module docstring)."""

    def __init__(self, policy: TinyModelPolicy, vocab_size: int, context_length: int) -> None:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=policy.hidden_size,
            intermediate_size=policy.hidden_size * 2,
            num_hidden_layers=policy.num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=context_length,
            # As scripts/sglang-cpu/build_model.py builds the real server's tiny model, so
            # that one trainer-side model fits both.
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
        )
        # Weights from our seed without moving the caller's global torch RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(policy.seed)
            self.model = Qwen2ForCausalLM(config).train(False)
        self.policy = policy
        self._torch = torch
        # transformers >= 5.2x names the KV cache ``cache``; before, ``past_key_values``.
        params = inspect.signature(self.model.forward).parameters
        self._cache_key = "cache" if "cache" in params else "past_key_values"

    def start(self, prompt: Sequence[int], seed: int | None, rid: str | None) -> Any:
        """A decoding state for one request (cheap; the prompt is run by the first step)."""
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"{self.policy.seed}:{seed if seed is not None else rid}:".encode())
        digest.update(array("q", prompt).tobytes())
        generator = self._torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little"))
        return {"pending": list(prompt), "past": None, "generator": generator}

    def load(self, model_path: str) -> Any:
        """A copy of the model with the weights of ``model_path`` (``model.safetensors``
        of a ``save_pretrained`` folder of this architecture), to take :attr:`model`'s
        place (blocking: run it in a worker thread). Raises ``ValueError`` saying what
        does not fit."""
        from safetensors.torch import load_file

        files = sorted(Path(model_path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors file in {model_path!r}")
        weights: dict[str, Any] = {}
        for file in files:
            weights.update(load_file(str(file)))
        model = copy.deepcopy(self.model)
        try:
            missing, unexpected = model.load_state_dict(weights, strict=False)
        except RuntimeError as exc:  # a shape that does not fit
            raise ValueError(f"the weights in {model_path!r} do not fit the model: {exc}") from exc
        # The output layer is the input embedding (tied): a checkpoint leaves it out.
        missing = [m for m in missing if m != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"the weights in {model_path!r} do not fit the model: missing {missing[:4]},"
                f" unexpected {unexpected[:4]}"
            )
        return model.train(False)

    def step(self, state: Any, temperature: float, model: Any = None) -> tuple[int, float]:
        """The next token and its log-prob, with ``model`` (default :attr:`model`; pass
        the one read when the step was scheduled) (blocking: run it in a worker thread)."""
        torch = self._torch
        module = self.model if model is None else model
        with torch.inference_mode():
            ids = torch.tensor([state["pending"]], dtype=torch.long)
            kwargs = {self._cache_key: state["past"]}
            out = module(input_ids=ids, use_cache=True, **kwargs)
            logits = out.logits[0, -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            if temperature <= 0:
                token = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=state["generator"]))
        state["past"] = out[self._cache_key]
        state["pending"] = [token]
        return token, float(logprobs[token])

    def logprobs(self, prompt: Sequence[int], output: Sequence[int]) -> list[float]:
        """The log-prob of each ``output`` token after ``prompt`` in one forward pass."""
        torch = self._torch
        with torch.inference_mode():
            ids = torch.tensor([[*prompt, *output]], dtype=torch.long)
            logits = self.model(input_ids=ids).logits[0].float()
            all_lp = torch.log_softmax(logits, dim=-1)
        start = len(prompt) - 1
        return [float(all_lp[start + i, t]) for i, t in enumerate(output)]
