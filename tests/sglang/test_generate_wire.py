"""SGLang's /generate as miles_lite reads it: sampling keys, payloads, answers into samples,
the sample invariants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_lite.errors import (
    ConfigError,
    EngineProtocolError,
    SampleInvariantError,
    SamplingParamsError,
)
from miles_lite.rollout.context import InFlight
from miles_lite.sglang.generate_wire import (
    FINISH_STATUS,
    build_generate_payload,
    new_rid,
    parse_generate_answer,
)
from miles_lite.sglang.sampling import SAMPLING_KEYS, TextSamplingParams, check_sampling_params
from miles_lite.text.request import append_env_tokens, apply_answer
from miles_lite.types import Sample, SampleStatus, WeightSpan


def apply_generate_answer(sample: Sample, answer: dict[str, Any]) -> list[int]:
    """Check ``answer`` (to its own rid) and append it to ``sample``; the new ids."""
    parsed = parse_generate_answer(answer, rid=answer["meta_info"]["id"])
    apply_answer(sample, parsed)
    return parsed.ids


def status_of(answer: dict[str, Any]) -> SampleStatus:
    return FINISH_STATUS[answer["meta_info"]["finish_reason"]["type"]]


def _answers(captures: Path) -> list[dict[str, Any]]:
    """Every real /generate answer of the captures that carries output log-probs."""
    found = []
    for path in sorted(captures.glob("gen_*.json")):
        data = json.loads(path.read_text())
        answers = data if isinstance(data, list) else [data]
        found.extend(a for a in answers if "output_token_logprobs" in a["meta_info"])
    return found


# sampling parameters -----------------------------------------------------------------


def test_the_sampling_keys_are_exactly_the_ones_sglang_lists(captures: Path) -> None:
    # The 400 SGLang answered to an unknown key lists every key it accepts.
    error = json.loads((captures / "gen_bad_sampling_key.txt").read_text().splitlines()[0])
    listed = [part.strip(" `") for part in error["error"].split("expected one of ")[1].split(",")]
    assert tuple(listed) == SAMPLING_KEYS  # the same keys, in SGLang's order


def test_defaults_are_miles_compute_sampling_params() -> None:
    assert TextSamplingParams(max_new_tokens=16).to_payload() == {
        "max_new_tokens": 16,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    params = TextSamplingParams(stop=["\n\n"], stop_token_ids=[151645], extra={"min_p": 0.1})
    payload = params.to_payload()
    assert payload["stop"] == ["\n\n"] and payload["min_p"] == 0.1
    payload["stop"].append("x")  # a fresh copy every time
    assert params.to_payload()["stop"] == ["\n\n"]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"max_tokens": 8}, "'max_tokens' (did you mean 'max_new_tokens'?)"),
        ({"seed": 1}, "'seed' (did you mean 'sampling_seed'?)"),
        ({"temperature": 1.0, "bogus": 1}, "'bogus'"),
        ({"n": 2}, "'n' must be 1"),
    ],
)
def test_an_unknown_key_is_refused_naming_it(params: dict[str, Any], named: str) -> None:
    with pytest.raises(SamplingParamsError, match="sampling key") as info:
        check_sampling_params(params)
    assert named in str(info.value)
    assert isinstance(info.value, ConfigError)
    if "n" not in params:
        assert "max_new_tokens" in str(info.value)  # the allowed keys are listed


def test_sampling_params_config_errors_name_the_field() -> None:
    with pytest.raises(SamplingParamsError, match="max_new_tokens must be an int >= 1, got -1"):
        TextSamplingParams(max_new_tokens=-1)
    with pytest.raises(SamplingParamsError, match="max_new_tokens must be an int >= 1, got True"):
        TextSamplingParams(max_new_tokens=True)
    with pytest.raises(SamplingParamsError, match="repeats fields"):
        TextSamplingParams(extra={"temperature": 0.5})
    with pytest.raises(SamplingParamsError, match="'max_tokens'"):
        TextSamplingParams(extra={"max_tokens": 4})


# payloads ----------------------------------------------------------------------------


def test_a_payload_is_ids_checked_params_logprobs_and_a_fresh_rid() -> None:
    params = {"max_new_tokens": 4, "temperature": 0.5}
    payload = build_generate_payload([1, 2, 3], params, seed=7)
    assert payload["input_ids"] == [1, 2, 3]
    # The caller's own (per-call) dict is sent as it is: no copy per request.
    assert payload["sampling_params"] is params
    assert params == {"max_new_tokens": 4, "temperature": 0.5, "sampling_seed": 7}
    assert payload["return_logprob"] is True
    assert "logprob_start_len" not in payload and "image_data" not in payload
    rids = {build_generate_payload([1], {})["rid"] for _ in range(200)}
    assert len(rids) == 200 and {len(r) for r in rids} == {32}
    # No rid is a prefix of another: SGLang aborts by rid prefix.
    assert not any(a != b and b.startswith(a) for a in rids for b in rids)
    # An explicit seed wins over the sample's; no seed, no key.
    explicit = build_generate_payload([1], {"sampling_seed": 3}, seed=7)
    assert explicit["sampling_params"]["sampling_seed"] == 3
    assert "sampling_seed" not in build_generate_payload([1], {})["sampling_params"]
    with_images = build_generate_payload([1], {}, image_data=["data:image/png;base64,x"])
    assert with_images["image_data"] == ["data:image/png;base64,x"]
    assert len(new_rid()) == 32


def test_a_payload_with_an_unknown_key_is_never_built() -> None:
    with pytest.raises(SamplingParamsError, match="'max_tokens'"):
        build_generate_payload([1], {"max_tokens": 4})


# answers -----------------------------------------------------------------------------


def test_real_answers_fill_the_sample_from_output_token_logprobs(captures: Path) -> None:
    answers = _answers(captures)
    assert len(answers) >= 4
    for answer in answers:
        meta = answer["meta_info"]
        sample = Sample(tokens=[9, 9])
        new = apply_generate_answer(sample, answer)
        triples = meta["output_token_logprobs"]
        assert new == [t[1] for t in triples] == answer["output_ids"]
        assert sample.tokens == [9, 9, *new]
        assert sample.response == answer["text"]
        assert sample.response_length == len(new)
        assert sample.loss_mask == [1] * len(new)
        assert sample.rollout_log_probs == [t[0] for t in triples]
        assert sample.weight_versions == [meta["weight_version"]]
        assert sample.request_id == meta["id"]
        assert sample.status is status_of(answer)
        assert sample.prefix_cache_info.cached_tokens == meta["cached_tokens"]
        assert sample.prefix_cache_info.total_prompt_tokens == meta["prompt_tokens"]
        sample.validate()


def test_a_second_answer_appends_and_records_its_weight_version(captures: Path) -> None:
    answer = json.loads((captures / "gen_stop.json").read_text())
    n = len(answer["output_ids"])
    spans = [{"version": "2", "start": 0, "end": n}]
    later = {
        **answer,
        "meta_info": {**answer["meta_info"], "weight_version": "2", "weight_versions": spans},
    }
    sample = Sample(tokens=[1])
    apply_generate_answer(sample, answer)
    apply_generate_answer(sample, later)
    assert sample.response_length == 2 * n and len(sample.tokens) == 1 + 2 * n
    assert sample.weight_versions == ["default", "2"]
    # Which version made which response tokens: the second answer's span is shifted.
    assert sample.weight_spans == [WeightSpan("default", 0, n), WeightSpan("2", n, 2 * n)]
    assert sample.prefix_cache_info.total_prompt_tokens == 2 * answer["meta_info"]["prompt_tokens"]
    sample.validate()


@pytest.mark.parametrize(
    ("finish", "status"),
    [
        ({"type": "stop", "matched": 151645}, SampleStatus.COMPLETED),
        ({"type": "length", "length": 3}, SampleStatus.TRUNCATED),
        ({"type": "abort", "message": "Aborted"}, SampleStatus.ABORTED),
    ],
)
def test_status_follows_finish_reason(finish: dict[str, Any], status: SampleStatus) -> None:
    answer = {
        "text": "hi",
        "output_ids": [5],
        "meta_info": {
            "id": "r",
            "finish_reason": finish,
            "output_token_logprobs": [[-0.5, 5, None]],
        },
    }
    sample = Sample(tokens=[1])
    apply_generate_answer(sample, answer)
    assert sample.status is status
    assert sample.finish_reason == finish["type"]
    if "matched" in finish:
        assert sample.matched_stop == 151645


def test_answers_that_do_not_line_up_are_typed_errors(captures: Path) -> None:
    # Asked without return_logprob (the abort capture): no log-probs to train on.
    no_logprobs = json.loads((captures / "abort_victim.json").read_text())
    with pytest.raises(EngineProtocolError, match="output_token_logprobs is NoneType"):
        apply_generate_answer(Sample(tokens=[1]), no_logprobs)
    good = json.loads((captures / "gen_stop.json").read_text())
    with pytest.raises(EngineProtocolError, match="differ from the ids of output_token_logprobs"):
        apply_generate_answer(Sample(tokens=[1]), {**good, "output_ids": [0, 0, 0]})
    odd = {**good, "meta_info": {**good["meta_info"], "finish_reason": {"type": "eaten"}}}
    with pytest.raises(EngineProtocolError, match=r"unexpected meta_info\.finish_reason") as info:
        apply_generate_answer(Sample(tokens=[1]), odd)
    assert info.value.request_id == good["meta_info"]["id"]


def test_env_tokens_get_mask_zero_and_log_prob_zero() -> None:
    sample = Sample(tokens=[1, 2])
    append_env_tokens(sample, [7, 8, 9], "<tool>")
    assert sample.tokens == [1, 2, 7, 8, 9] and sample.response == "<tool>"
    assert sample.loss_mask == [0, 0, 0] and sample.rollout_log_probs == [0.0, 0.0, 0.0]
    assert sample.response_length == 3
    sample.validate()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"tokens": [1], "response_length": 2}, "tokens has 1 entries < response_length 2"),
        ({"tokens": [1, 2], "response_length": 1, "loss_mask": [1, 1]}, "loss_mask has 2"),
        (
            {"tokens": [1, 2], "response_length": 2, "rollout_log_probs": [0.0]},
            "rollout_log_probs has 1",
        ),
        # Values, not only lengths: what a sample holds is training data.
        ({"tokens": [1, 2.0], "response_length": 1}, "tokens[1] is 2.0"),
        ({"tokens": [1, -4], "response_length": 1}, "tokens[1] is -4"),
        ({"tokens": [1, True], "response_length": 1}, "tokens[1] is True"),
        ({"tokens": [1, None, 3], "response_length": 1}, "tokens[1] is None"),
        ({"tokens": "12", "response_length": 1}, "tokens[0] is '1'"),
        ({"tokens": [1, 2], "response_length": 1, "loss_mask": [2]}, "loss_mask holds [2]"),
        (
            {"tokens": [1, 2], "response_length": 1, "rollout_log_probs": [float("nan")]},
            "rollout_log_probs[0] is nan",
        ),
        (
            {"tokens": [1, 2], "response_length": 1, "rollout_log_probs": [0.25]},
            "rollout_log_probs[0] is 0.25",
        ),
        (
            {
                "tokens": [1, 2, 3],
                "response_length": 2,
                "loss_mask": [1, 0],
                "rollout_log_probs": [-0.5, -0.5],
            },
            "not 0.0 where loss_mask is 0",
        ),
        (
            {"tokens": [1, 2], "response_length": 1, "weight_spans": [WeightSpan("v", 0, 2)]},
            "outside the response",
        ),
    ],
)
def test_invariant_violations_are_typed_and_named(fields: dict[str, Any], problem: str) -> None:
    sample = Sample(index=4, request_id="rid-x", **fields)
    with pytest.raises(SampleInvariantError, match="sample 4") as info:
        sample.validate()
    vocab = Sample(tokens=[1, 200], response_length=1)
    vocab.validate()
    with pytest.raises(SampleInvariantError, match=r"tokens\[1\] is 200"):
        vocab.validate(vocab_size=100)
    assert problem in str(info.value) and info.value.request_id == "rid-x"
    with pytest.raises(SampleInvariantError):
        sample.validate()


def test_in_flight_requests_track_and_forget() -> None:
    in_flight = InFlight()
    with in_flight.track("a"), in_flight.track("b"):
        assert in_flight.rids() == ["a", "b"] and len(in_flight) == 2
        # An abort reaches each rid at the engine that got it; a waiting one, nowhere.
        in_flight.sent_to("a", "http://e1")
        assert in_flight.by_engine() == {"http://e1": ["a"]}
    assert len(in_flight) == 0
    with pytest.raises(RuntimeError), in_flight.track("c"):
        raise RuntimeError("the request failed")
    assert in_flight.rids() == []


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("model"), st.integers(0, 6), st.sampled_from(["stop", "length"])),
            st.tuples(st.just("env"), st.integers(0, 6), st.just("")),
        ),
        max_size=8,
    ),
    st.integers(0, 5),
)
def test_any_mix_of_model_and_env_turns_keeps_the_invariants(
    turns: list[tuple[str, int, str]], prompt_len: int
) -> None:
    sample = Sample(tokens=list(range(prompt_len)))
    expected_mask: list[int] = []
    for kind, n, finish in turns:
        ids = list(range(100, 100 + n))
        if kind == "model":
            answer = {
                "text": "x" * n,
                "output_ids": ids,
                "meta_info": {
                    "id": "r",
                    "finish_reason": {"type": finish},
                    "output_token_logprobs": [[-0.25, i, None] for i in ids],
                    "weight_version": "1",
                },
            }
            apply_generate_answer(sample, answer)
            expected_mask += [1] * n
        else:
            append_env_tokens(sample, ids)
            expected_mask += [0] * n
        sample.validate()
    assert (sample.loss_mask or []) == expected_mask
    assert len(sample.tokens) == prompt_len + sample.response_length
    assert [lp == 0.0 for lp in sample.rollout_log_probs or []] == [m == 0 for m in expected_mask]
