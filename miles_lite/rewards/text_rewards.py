"""Rule-based text rewards, as miles' ``math``/``dapo`` and ``f1`` reward types.

Plain picklable functions ``(samples) -> list[float | dict]`` that run in a reward pool,
never on the event loop. The label is ``sample.label`` (the ground truth).
:data:`TEXT_REWARDS` names them as miles' ``--rm-type`` does, so that
``rewards=TEXT_REWARDS`` lets each sample pick its kind by ``metadata["rm_type"]``;
:func:`dapo_reward` returns a dict (``score``, ``acc``, ``pred``) that ``reward_key``
picks from.
"""

from __future__ import annotations

import collections
import re
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from miles_lite.types import Sample

__all__ = [
    "TEXT_REWARDS",
    "dapo_reward",
    "extract_boxed",
    "f1_reward",
    "f1_score",
    "final_answer",
    "math_reward",
    "normalize_answer",
]

_FINAL = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*([^\n]+)", re.IGNORECASE)
# Words and marks that dress an answer without changing it (units, degrees, spacing).
_UNITS = re.compile(
    r"\\text\{\s*(?:units?|dollars?|cents?|degrees?|inches|inch|feet|foot|meters?|cm|km|"
    r"hours?|minutes?|seconds?|mph|points?|ways|students|digits|pounds)\s*\}"
    r"|\^\s*\{?\\circ\}?|\\circ|\\%|%|\\[,;!: ]|\\(?:mathrm|mbox)\{th\}"
)
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox|boxed)\{([^{}]*)\}")
_SHORT_FRAC = re.compile(r"\\frac(\d)(\d)")
_SHORT_FRAC_1 = re.compile(r"\\frac(\d)\{")
_SHORT_SQRT = re.compile(r"\\sqrt(\w)")


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
    """An answer in a canonical written form, so that equal answers compare equal.

    Keeps what follows the last ``=`` (``x = 5`` is ``5``); drops ``$``, spaces, units,
    degrees and percent signs, ``\\text{}``/``\\left``/``\\right`` wrappers, trailing
    dots, thousands separators and trailing zeros of decimals; writes ``\\dfrac`` and
    ``\\tfrac`` as ``\\frac`` and ``\\frac12``/``\\sqrt2`` with braces.
    """
    s = answer.strip().replace("$", "")
    s = s.split("=")[-1]
    s = _UNITS.sub("", s)
    for _ in range(3):  # nested wrappers
        s = _TEXT_WRAP.sub(r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _SHORT_FRAC_1.sub(r"\\frac{\1}{", s)
    s = _SHORT_SQRT.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "").strip().rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d*)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.\d*", s):
        s = s.rstrip("0").rstrip(".")
    if re.fullmatch(r"-?\d+", s):
        s = str(int(s))  # "007" is 7, "-0" is 0
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


def _dapo_prediction(text: str) -> str | None:
    # DAPO's prompt asks for a last line "Answer: ..."; a boxed answer also counts.
    found = re.findall(r"Answer\s*:\s*([^\n]+)", text[-300:])
    if found:
        return str(found[-1]).strip()
    return extract_boxed(text)


def dapo_reward(samples: list[Sample]) -> list[dict[str, float | bool | str]]:
    """DAPO's rule: ``score`` 1.0 for a right final answer, -1.0 otherwise (no answer
    included); ``acc`` whether it was right, ``pred`` the answer read (or ``"[INVALID]"``).
    Pick ``score`` with ``reward_key="score"``."""
    out: list[dict[str, float | bool | str]] = []
    for sample in samples:
        pred = _dapo_prediction(sample.response)
        want = "" if sample.label is None else str(sample.label)
        acc = pred is not None and normalize_answer(pred) == normalize_answer(want)
        out.append({"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred or "[INVALID]"})
    return out


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


#: The rule-based text rewards by miles' ``rm_type`` names (``deepscaler`` is its math rule).
TEXT_REWARDS = {
    "math": math_reward,
    "deepscaler": math_reward,
    "dapo": dapo_reward,
    "f1": f1_reward,
}
