"""record_from_choice: an engine's chat answer read into a TurnRecord, or refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.chat_wire import record_from_choice
from miles_lite.sglang.generate_wire import parse_generate_answer


def answer(triples: Any, prompt: Any = None) -> dict[str, Any]:
    return {
        "choices": [
            {
                "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3] if prompt is None else prompt,
                "meta_info": {"output_token_logprobs": triples, "weight_version": "w"},
            }
        ]
    }


def read(body: dict[str, Any]) -> Any:
    return record_from_choice(body, rid="r", engine_url="http://e", request={})


def test_a_good_answer_is_read_with_float_log_probs() -> None:
    record = read(answer([[-0.5, 10, "a"], [0, 11, None], (-1.25, 12)]))
    assert record.prompt_ids == [1, 2, 3] and record.output_ids == [10, 11, 12]
    assert record.output_log_probs == [-0.5, 0.0, -1.25]
    assert all(type(x) is float for x in record.output_log_probs)
    assert (record.finish_reason, record.weight_version) == ("stop", "w")


@pytest.mark.parametrize(
    ("triples", "bad"),
    [
        ([[-0.5, 10], [-0.5, "11"]], 1),  # id not an int
        ([[-0.5, 10], [None, 11]], 1),  # no log-prob
        ([[-0.5, 10], [-0.5, 11], "xy"], 2),  # not a triple
        ([[-0.5, 10], [-0.5]], 1),  # too short
        ([{0: -0.5, 1: 10}], 0),  # a mapping that indexes like one
        ([[True, 10]], 0),  # a bool is not a log-prob
    ],
)
def test_a_bad_triple_is_named(triples: list[Any], bad: int) -> None:
    with pytest.raises(EngineProtocolError, match=rf"output_token_logprobs\[{bad}\]"):
        read(answer(triples))


@pytest.mark.parametrize("prompt", [[1, "2"], [1, 2.0], [1, True], [None], "123", None])
def test_prompt_ids_must_be_a_list_of_ints(prompt: Any) -> None:
    body = answer([[-0.5, 10]], prompt=[] if prompt is None else prompt)
    if prompt is None:
        del body["choices"][0]["prompt_token_ids"]
    with pytest.raises(EngineProtocolError, match="prompt_token_ids"):
        read(body)


def test_an_answer_naming_another_request_is_refused_as_on_generate() -> None:
    # issue 30 D6: the chat path holds meta_info.id to the turn's rid, as /generate does.
    body = answer([[-0.5, 10]])
    body["choices"][0]["meta_info"]["id"] = "another"
    with pytest.raises(EngineProtocolError, match=r"meta_info\.id is 'another'") as chat:
        read(body)
    meta = {"id": "another", "finish_reason": {"type": "stop"}, "output_token_logprobs": []}
    with pytest.raises(EngineProtocolError, match=r"meta_info\.id is 'another'") as generate:
        parse_generate_answer({"meta_info": meta}, rid="r", url="http://e")
    assert str(chat.value) == str(generate.value)
    body["choices"][0]["meta_info"]["id"] = "r"
    assert read(body).output_ids == [10]


def test_an_answer_longer_than_the_turns_budget_is_an_engine_protocol_error() -> None:
    # issue 30 D7: 100,000 tokens recorded for a turn of 32 is the engine's fault.
    body = answer([[-0.5, 10]] * 33)
    with pytest.raises(EngineProtocolError, match="33 output tokens for a turn of max_tokens=32"):
        record_from_choice(body, rid="r", engine_url="http://e", request={"max_tokens": 32})
    ok = answer([[-0.5, 10]] * 32)
    record = record_from_choice(ok, rid="r", engine_url="http://e", request={"max_tokens": 32})
    assert len(record.output_ids) == 32


def test_cached_tokens_are_read_and_checked() -> None:
    body = answer([[-0.5, 10]])
    body["choices"][0]["meta_info"]["cached_tokens"] = 2
    assert read(body).cached_tokens == 2
    body["choices"][0]["meta_info"]["cached_tokens"] = -1
    with pytest.raises(EngineProtocolError, match="cached_tokens"):
        read(body)


@pytest.mark.parametrize("prompt", [[1, -1], [1, 100], [10**30]])
def test_prompt_ids_outside_the_vocabulary_are_refused(prompt: list[int]) -> None:
    body = answer([[-0.5, 10]], prompt=prompt)
    with pytest.raises(EngineProtocolError, match=r"outside \[0, 100\)"):
        record_from_choice(body, rid="r", engine_url="http://e", request={}, vocab_size=100)
    ok = answer([[-0.5, 10]], prompt=[0, 99])
    record = record_from_choice(ok, rid="r", engine_url="http://e", request={}, vocab_size=100)
    assert record.prompt_ids == [0, 99] and all(type(i) is int for i in record.prompt_ids)
