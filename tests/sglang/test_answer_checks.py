"""Values from the wire are checked, never coerced: each way an SGLang answer can be wrong
is refused with an EngineProtocolError naming the engine, the rid, the field and where."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.chat_wire import record_from_choice
from miles_lite.sglang.generate_wire import (
    GenerateAnswer,
    decode_generate_answer,
    parse_generate_answer,
)

URL = "http://engine:30000"


def generate_answer(captures: Path) -> dict[str, Any]:
    """A real /generate answer (3 output tokens), as SGLang 0.5.23 sent it."""
    answer: dict[str, Any] = json.loads((captures / "gen_stop.json").read_text())
    return answer


def changed(answer: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``answer`` with ``meta_info.<path>`` (dots and list indices) set."""
    out = copy.deepcopy(answer)
    node: Any = out["meta_info"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[_place(node, key)]
    node[_place(node, keys[-1])] = value
    return out


def _place(node: Any, key: str) -> Any:
    """A digit is a list index; in an object (an earlier change may have put one where a
    list was) it stays a string key, as every key JSON can carry."""
    return int(key) if isinstance(node, list) and key.isdigit() else key


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
@pytest.mark.parametrize("entry", ["parsed", "bytes"])
def test_a_bad_generate_answer_is_refused_by_name(
    captures: Path, path: str, value: Any, named: str, entry: str
) -> None:
    good = generate_answer(captures)
    rid = good["meta_info"]["id"]
    bad = changed(good, path, value)
    if path == "weight_version":
        del bad["meta_info"]["weight_versions"]
    with pytest.raises(EngineProtocolError, match=named) as caught:
        read(bad, rid, entry)
    assert (caught.value.url, caught.value.request_id) == (URL, rid)


def read(answer: Any, rid: str, entry: str) -> GenerateAnswer:
    """``answer`` read from parsed JSON, or from its bytes (the typed decode)."""
    if entry == "parsed":
        return parse_generate_answer(answer, rid=rid, url=URL, vocab_size=151_936)
    body = json.dumps(answer).encode()  # NaN and Infinity as Python writes them
    return decode_generate_answer(body, rid=rid, url=URL, vocab_size=151_936)


@pytest.mark.parametrize("entry", ["parsed", "bytes"])
def test_the_real_answer_is_read_as_it_is(captures: Path, entry: str) -> None:
    good = generate_answer(captures)
    answer = read(good, good["meta_info"]["id"], entry)
    assert answer.ids == good["output_ids"] and len(answer.log_probs) == 3
    assert (answer.cached_tokens, answer.prompt_tokens) == (1, 2)


@pytest.mark.parametrize("literal", [b"-1e400", b"NaN", b"-Infinity"])
def test_an_overflowing_or_non_finite_log_prob_in_the_bytes_is_refused(
    captures: Path, literal: bytes
) -> None:
    """JSON numbers past a double's range decode as infinity: still no log-prob."""
    good = generate_answer(captures)
    rid = good["meta_info"]["id"]
    good["meta_info"]["output_token_logprobs"][1][0] = -0.25
    body = json.dumps(good).encode().replace(b"-0.25", literal, 1)
    with pytest.raises(EngineProtocolError, match=r"\[1\].*not finite"):
        decode_generate_answer(body, rid=rid, url=URL, vocab_size=151_936)


def test_a_body_that_is_not_json_is_a_protocol_error() -> None:
    with pytest.raises(EngineProtocolError, match="not JSON") as caught:
        decode_generate_answer(b"<html>busy</html>", rid="r", url=URL)
    assert caught.value.request_id == "r"


#: Values an engine (or a proxy) might put anywhere in an answer.
ODD_VALUES: list[Any] = [
    *(None, 0, -1, 1, 3, 2.0, -0.5, 0.5, 151_936, 10**30, True, "", "x", "length", [], {}),
    *([-0.5, 3, None], [-0.5, 3, None, 1], [1], {"type": "stop"}, {"type": "tool_calls"}),
    *({"version": "v", "start": 0, "end": 3}, float("nan"), float("inf"), float("-inf")),
]
#: Where in the real answer (``meta_info.`` paths, as :func:`changed` takes them).
PATHS = [
    *("id", "output_token_logprobs", "output_token_logprobs.0", "output_token_logprobs.1.0"),
    *("output_token_logprobs.2.1", "output_token_logprobs.0.2", "completion_tokens"),
    *("prompt_tokens", "cached_tokens", "finish_reason", "finish_reason.type"),
    *("finish_reason.matched", "weight_version", "weight_versions", "weight_versions.0"),
    *("weight_versions.0.version", "weight_versions.0.start", "weight_versions.0.end"),
    "unknown_field",
]
#: Changes outside meta_info.
TOP_EDITS: list[tuple[str, Any]] = [
    ("output_ids", [0, 1, 2]),
    ("output_ids", None),
    ("output_ids", [True, 1, 2]),
    ("text", None),
    ("text", 5),
    ("meta_info", None),
]


def changed_if_there(answer: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """:func:`changed`, or ``answer`` as it is when an earlier change removed the place."""
    try:
        return changed(answer, path, value)
    except (KeyError, IndexError, TypeError):
        return answer


def outcome(answer: Any, rid: str, entry: str) -> Any:
    try:
        return read(answer, rid, entry)
    except EngineProtocolError as exc:
        return (str(exc), exc.url, exc.request_id)


def test_reading_the_bytes_and_the_parsed_answer_agree_on_every_single_change(
    captures: Path,
) -> None:
    """The typed decode of the bytes and the parser of the JSON give the same answer, or
    the same error, for every value at every place (the parser is the authority)."""
    good = generate_answer(captures)
    rid = good["meta_info"]["id"]
    answers = [good, {**good, "meta_info": {**good["meta_info"], "weight_versions": None}}]
    answers += [changed(good, path, value) for path in PATHS for value in ODD_VALUES]
    answers += [{**good, key: value} for key, value in TOP_EDITS]
    refused = 0
    for answer in answers:
        parsed = outcome(answer, rid, "parsed")
        assert outcome(answer, rid, "bytes") == parsed, answer
        refused += isinstance(parsed, tuple)
    assert 0 < refused < len(answers)  # both kinds of outcome were compared


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    edits=st.lists(
        st.tuples(st.sampled_from(PATHS), st.sampled_from(ODD_VALUES)), min_size=2, max_size=4
    )
)
def test_reading_the_bytes_and_the_parsed_answer_agree_on_several_changes(
    captures: Path, edits: list[tuple[str, Any]]
) -> None:
    answer = generate_answer(captures)
    rid = answer["meta_info"]["id"]
    for path, value in edits:
        answer = changed_if_there(answer, path, value)
    assert outcome(answer, rid, "bytes") == outcome(answer, rid, "parsed")


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
