"""What the text stand-in engine 'generates': a seeded, scripted policy over a real tokenizer.

Deterministic from the prompt and the request's seed, so tests can recompute an answer:

- a rule ``(pattern, response)`` whose regex is found in the prompt's last turn makes the
  model answer ``response`` (tokenized with the real tokenizer) followed by EOS: tool
  calls, ``\\boxed{}`` answers, stop strings; a request that resumes an aborted one
  (its prompt ends with the beginning of that answer) gets the rest of it;
- otherwise ``default_length`` tokens drawn from a fixed vocabulary range, then EOS.

Log-probs are a pure function of (position, token id): :func:`token_logprob`.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miles_lite.testing.tokenizers import fast_decode

__all__ = ["TextPolicy", "TextRule", "token_logprob"]

#: Ordinary BPE tokens of the Qwen3 vocabulary (no special tokens), for random answers.
_VOCAB_RANGE = (1000, 30000)
_TURN = "<|im_start|>"


def token_logprob(position: int, token: int) -> float:
    """The log-prob the stand-in reports for ``token`` at output ``position``: in [-2, -1)."""
    return -1.0 - ((token * 31 + position * 17) % 1000) / 1000.0


@dataclass(frozen=True, slots=True)
class TextRule:
    """Answer ``response`` when ``pattern`` (a regex) is found in the prompt's last turn.

    ``token_ids``, when given, is the answer instead (EOS still follows): a model's own
    tokens, which need not be the tokenizer's spelling of their text (three ``\n`` tokens
    where the tokenizer spells ``\n\n\n`` as one).

    With ``alternatives``, the answer is one of ``(response, *alternatives)``, drawn from
    the request's ``sampling_seed`` (else its rid): the samples of a group then differ,
    as a sampled model's do (a right and a wrong ``\\boxed{}`` answer, say), and a
    repeated request gets the same one.
    """

    pattern: str
    response: str = ""
    token_ids: Sequence[int] = ()
    alternatives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"TextRule.pattern {self.pattern!r} is not a regex: {exc}") from exc
        if not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.token_ids
        ):
            raise ValueError(f"TextRule.token_ids must be ints >= 0, got {self.token_ids!r}")
        if not isinstance(self.alternatives, tuple) or not all(
            isinstance(a, str) for a in self.alternatives
        ):
            raise ValueError(
                f"TextRule.alternatives must be a tuple of str, got {self.alternatives!r}"
            )
        if self.token_ids and self.alternatives:
            raise ValueError("TextRule takes token_ids or alternatives, not both")

    def pick(self, seed: int | None, rid: str | None) -> str:
        """The response for a request with this ``seed`` (or ``rid``)."""
        if not self.alternatives:
            return self.response
        digest = hashlib.blake2b(f"{seed if seed is not None else rid}".encode(), digest_size=8)
        choices = (self.response, *self.alternatives)
        return choices[int.from_bytes(digest.digest(), "little") % len(choices)]


@dataclass(frozen=True, kw_only=True)
class TextPolicy:
    """The scripted policy (see the module docstring).

    ``rules`` are tried in order; ``default_length`` tokens answer a prompt no rule
    matches, drawn from (``seed``, the request's ``sampling_seed`` or else its rid, the
    prompt): a group of samples with their own rids gets distinct answers, a repeated
    request the same one. ``eos`` ends every answer (as a model emits its end-of-turn
    token).
    """

    rules: Sequence[TextRule] = field(default_factory=tuple)
    default_length: int = 16
    eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int):
            raise ValueError(f"TextPolicy.seed must be an int, got {self.seed!r}")
        if not isinstance(self.default_length, int) or self.default_length < 0:
            raise ValueError(
                f"TextPolicy.default_length must be an int >= 0, got {self.default_length!r}"
            )

    def answer(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        seed: int | None,
        rid: str | None = None,
    ) -> list[int]:
        """The full answer (EOS included) this policy gives to ``prompt_ids``; ``seed`` is
        the request's ``sampling_seed``, ``rid`` its rid (used when ``seed`` is None)."""
        if self.rules:
            text = fast_decode(tokenizer, prompt_ids, skip_special_tokens=False)
            last_turn = _last_turn(text)
            for rule in self.rules:
                if re.search(rule.pattern, last_turn):
                    ids = list(rule.token_ids) or list(
                        tokenizer.encode(rule.pick(seed, rid), add_special_tokens=False)
                    )
                    ids += [_eos_id(tokenizer)] if self.eos else []
                    return _continued(tokenizer, prompt_ids, ids)
        digest = hashlib.blake2b(digest_size=8)
        digest.update(f"{self.seed}:{seed if seed is not None else rid}:".encode())
        digest.update(array("q", prompt_ids).tobytes())
        rand = random.Random(int.from_bytes(digest.digest(), "little"))
        ids = [rand.randrange(*_VOCAB_RANGE) for _ in range(self.default_length)]
        return ids + ([_eos_id(tokenizer)] if self.eos else [])


def _continued(tokenizer: Any, prompt_ids: Sequence[int], answer: list[int]) -> list[int]:
    """What is left of ``answer`` when the prompt already ends with its beginning (a
    request resuming an aborted one sends its partial output back): the rest of it, as a
    model continues a partial turn; else all of it."""
    opener = _opener(tokenizer)
    width = len(opener)
    # The partial output is shorter than the answer: only the prompt's tail can hold it
    # (a long prompt is never scanned whole, once per request).
    ids = list(prompt_ids[-(len(answer) + width) :])
    for at in range(len(ids) - width, -1, -1):
        if ids[at] == opener[0] and ids[at : at + width] == opener:
            partial = ids[at + width :]
            if partial and answer[: len(partial)] == partial:
                return answer[len(partial) :]
            return answer
    return answer


@functools.lru_cache(maxsize=8)
def _opener(tokenizer: Any) -> list[int]:
    """The ids that open an assistant turn in the chat template."""
    return list(tokenizer.encode(f"{_TURN}assistant\n", add_special_tokens=False))


def _last_turn(text: str) -> str:
    """The prompt's last message (before the generation prompt), or all of a plain prompt."""
    starts = [m.start() for m in re.finditer(re.escape(_TURN), text)]
    if len(starts) >= 2 and text[starts[-1] :].startswith(f"{_TURN}assistant"):
        return text[starts[-2] : starts[-1]]
    return text


def _eos_id(tokenizer: Any) -> int:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(eos, int) and eos >= 0 and eos != tokenizer.unk_token_id:
        return eos
    return int(tokenizer.eos_token_id)
