"""Rule-based text rewards, as miles' ``math``/``dapo`` and ``f1`` reward types.

Plain picklable functions ``(samples) -> list[float]`` that run in a reward pool, never on
the event loop. The label is ``sample.label`` (the ground truth).
"""

from __future__ import annotations

import collections
import re
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from miles_lite.types import Sample

__all__ = [
    "extract_boxed",
    "f1_reward",
    "f1_score",
    "final_answer",
    "math_reward",
    "normalize_answer",
]

_FINAL = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*([^\n]+)", re.IGNORECASE)


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces kept), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def final_answer(text: str) -> str | None:
    """The answer a response gives: its last ``\\boxed{}``, else after "answer is"/"answer:"."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    found = _FINAL.findall(text)
    return found[-1].strip().rstrip(".") if found else None


def normalize_answer(answer: str) -> str:
    """Strip spaces, ``$``, ``\\text{}``, ``\\left``/``\\right``, trailing dots and zeros
    of decimals, so that ``"$5.0$"`` and ``"5"`` compare equal."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "")
    s = s.replace("\\!", "").replace(" ", "").rstrip(".")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if re.fullmatch(r"-?\d+\.\d*", s):
        s = s.rstrip("0").rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    return s


def math_reward(samples: list[Sample]) -> list[float]:
    """1.0 when the response's final answer equals the label after normalisation, else 0.0
    (no answer found: 0.0)."""
    scores = []
    for sample in samples:
        got = final_answer(sample.response)
        want = "" if sample.label is None else str(sample.label)
        scores.append(float(got is not None and normalize_answer(got) == normalize_answer(want)))
    return scores


def _tokens(text: str) -> list[str]:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return text.split()


def f1_score(prediction: str, truth: str) -> float:
    """SQuAD-style token F1 between two short answers (lowercased, no punctuation or
    articles)."""
    pred, gold = _tokens(prediction), _tokens(truth)
    if not pred or not gold:
        return float(pred == gold)
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_reward(samples: list[Sample]) -> list[float]:
    """Token F1 of each response's final answer (or the whole response) against its label."""
    return [
        f1_score(final_answer(s.response) or s.response, "" if s.label is None else str(s.label))
        for s in samples
    ]
