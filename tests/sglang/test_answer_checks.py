"""Values from the wire are checked, never coerced: each way an SGLang answer can be wrong
is refused with an EngineProtocolError naming the engine, the rid, the field and where."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.chat_wire import record_from_choice
from miles_lite.sglang.generate_wire import parse_generate_answer

URL = "http://engine:30000"


def generate_answer(captures: Path) -> dict[str, Any]:
    """A real /generate answer (3 output tokens), as SGLang 0.5.23 sent it."""
    answer: dict[str, Any] = json.loads((captures / "gen_stop.json").read_text())
    return answer


def changed(answer: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``answer`` with ``meta_info.<path>`` (dots and list indices) set."""
    out = copy.deepcopy(answer)
    node: Any = out["meta_info"]
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        # None is no log-prob (it was read as 0.0: probability 1, training data).
        ("output_token_logprobs.1.0", None, r"output_token_logprobs\[1\].*log-prob is None"),
        ("output_token_logprobs.1.0", float("nan"), r"\[1\].*not finite"),
        ("output_token_logprobs.2.0", float("-inf"), r"\[2\].*not finite"),
        ("output_token_logprobs.0.0", "nan", r"\[0\].*not a number"),
        ("output_token_logprobs.0.0", 0.5, r"\[0\].*positive"),
        ("output_token_logprobs.1.1", 290.0, r"\[1\].*id is float"),
        ("output_token_logprobs.1.1", "290", r"\[1\].*id is str"),
        ("output_token_logprobs.1.1", -3, r"\[1\].*outside the vocabulary"),
        ("output_token_logprobs.1.1", 999_999, r"\[1\].*outside the vocabulary"),
        ("output_token_logprobs", None, r"output_token_logprobs is NoneType"),
        ("completion_tokens", 5, r"completion_tokens is 5 for 3 output tokens"),
        ("id", "someone-else", r"meta_info\.id is 'someone-else'.*not this request"),
        ("cached_tokens", -1, r"meta_info\.cached_tokens is -1"),
        ("cached_tokens", "1", r"meta_info\.cached_tokens is '1'"),
        ("prompt_tokens", 2.0, r"meta_info\.prompt_tokens is 2\.0"),
        ("finish_reason.type", "eaten", r"unexpected meta_info\.finish_reason"),
        ("weight_versions.0.end", 2, r"weight_versions .* do not cover the 3 output tokens"),
        ("weight_version", 7, r"(weight_version|weight_versions)"),
    ],
)
def test_a_bad_generate_answer_is_refused_by_name(
    captures: Path, path: str, value: Any, named: str
) -> None:
    good = generate_answer(captures)
    rid = good["meta_info"]["id"]
    bad = changed(good, path, value)
    if path == "weight_version":
        del bad["meta_info"]["weight_versions"]
    with pytest.raises(EngineProtocolError, match=named) as caught:
        parse_generate_answer(bad, rid=rid, url=URL, vocab_size=151_936)
    assert (caught.value.url, caught.value.request_id) == (URL, rid)


def test_the_real_answer_is_read_as_it_is(captures: Path) -> None:
    good = generate_answer(captures)
    read = parse_generate_answer(good, rid=good["meta_info"]["id"], url=URL, vocab_size=151_936)
    assert read.ids == good["output_ids"] and len(read.log_probs) == 3
    assert (read.cached_tokens, read.prompt_tokens) == (1, 2)


def chat_answer(captures: Path) -> dict[str, Any]:
    """A real chat answer with return_meta_info-style triples added (the capture was taken
    with return_token_ids, which gives the ids without log-probs)."""
    answer: dict[str, Any] = json.loads((captures / "chat_tiny_qwen.json").read_text())
    choice = answer["choices"][0]
    choice["meta_info"] = {
        "output_token_logprobs": [
            [item["logprob"], token, None]
            for item, token in zip(
                choice["logprobs"]["content"], choice["response_token_ids"], strict=True
            )
        ],
        "completion_tokens": len(choice["response_token_ids"]),
        "weight_versions": answer["metadata"]["weight_versions"],
    }
    return answer


def read_chat(answer: dict[str, Any]) -> Any:
    return record_from_choice(answer, rid="rid-1", engine_url=URL, request={}, vocab_size=151_936)


def test_a_real_chat_answer_is_recorded(captures: Path) -> None:
    record = read_chat(chat_answer(captures))
    assert record.output_ids == [198] * 6 and len(record.output_log_probs) == 6
    assert record.finish_reason == "length" and record.weight_version == "default"


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda c, a: c["meta_info"]["output_token_logprobs"][3].__setitem__(0, float("nan")),
            r"\[3\].*not finite",
        ),
        (
            lambda c, a: c["meta_info"]["output_token_logprobs"][0].__setitem__(0, 1e-3),
            r"\[0\].*positive",
        ),
        (
            lambda c, a: c["meta_info"].__setitem__("completion_tokens", 7),
            "counts 7 completion tokens",
        ),
        (lambda c, a: c.__setitem__("prompt_token_ids", []), "prompt_token_ids"),
        (lambda c, a: c.__setitem__("finish_reason", "eaten"), "finish_reason 'eaten'"),
        (lambda c, a: c.__setitem__("finish_reason", None), "finish_reason None"),
        (lambda c, a: a["choices"].append(dict(c)), "2 choices"),
        (lambda c, a: c["prompt_token_ids"].__setitem__(0, 10**9), "outside"),
    ],
)
def test_a_bad_chat_answer_is_refused_by_name(captures: Path, edit: Any, named: str) -> None:
    answer = chat_answer(captures)
    edit(answer["choices"][0], answer)
    with pytest.raises(EngineProtocolError, match=named) as caught:
        read_chat(answer)
    assert (caught.value.url, caught.value.request_id) == (URL, "rid-1")
