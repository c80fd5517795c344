"""TextSamplingParams refuses, when it is built, every value SGLang would refuse (or that
would make every sample fail), naming the field and the value."""

from __future__ import annotations

import math

import pytest

from miles_lite.errors import ConfigError, SamplingParamsError
from miles_lite.sglang.sampling import TextSamplingParams

BAD = [
    ("temperature", math.nan, "temperature must be a finite number >= 0, got nan"),
    ("temperature", math.inf, "temperature must be a finite number >= 0, got inf"),
    ("temperature", -1.0, "temperature must be a finite number >= 0, got -1.0"),
    ("temperature", "1", "temperature must be a finite number >= 0, got '1'"),
    ("top_p", 2.0, r"top_p must be a finite number in \(0, 1\], got 2.0"),
    ("top_p", 0.0, r"top_p must be a finite number in \(0, 1\], got 0.0"),
    ("top_p", math.nan, r"top_p must be a finite number in \(0, 1\], got nan"),
    ("top_k", 0, "top_k must be an int -1 or >= 1, got 0"),
    ("top_k", -2, "top_k must be an int -1 or >= 1, got -2"),
    ("top_k", 1.5, "top_k must be an int -1 or >= 1, got 1.5"),
    ("max_new_tokens", 0, "max_new_tokens must be an int >= 1, got 0"),
    ("max_new_tokens", -3, "max_new_tokens must be an int >= 1, got -3"),
    ("max_new_tokens", True, "max_new_tokens must be an int >= 1, got True"),
    ("max_new_tokens", 8.0, "max_new_tokens must be an int >= 1, got 8.0"),
    ("stop", "x", "stop must be None or a list of str, got 'x'"),
    ("stop_token_ids", [1, "2"], r"stop_token_ids must be None or a list of int, got \[1, '2'\]"),
    ("no_stop_trim", 1, "no_stop_trim must be a bool, got 1"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD)
def test_a_value_sglang_refuses_is_refused_naming_the_field(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(SamplingParamsError, match=f"TextSamplingParams.{message}"):
        TextSamplingParams(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"min_p": 1.5}, r"extra\['min_p'\] must be a finite number in \[0, 1\], got 1.5"),
        ({"min_p": math.nan}, r"extra\['min_p'\] must be a finite number in \[0, 1\], got nan"),
        ({"frequency_penalty": 3}, r"extra\['frequency_penalty'\] .* in \[-2, 2\], got 3"),
        ({"presence_penalty": -2.5}, r"extra\['presence_penalty'\] .* in \[-2, 2\], got -2.5"),
        ({"repetition_penalty": 2.5}, r"extra\['repetition_penalty'\] .* in \[0, 2\], got 2.5"),
        ({"min_new_tokens": -1}, r"extra\['min_new_tokens'\] must be an int >= 0, got -1"),
        ({"min_new_tokens": 9}, r"extra\['min_new_tokens'\] \(9\) must be <= max_new_tokens \(8\)"),
    ],
)
def test_numeric_extras_are_held_to_sglang_ranges(extra: dict[str, object], message: str) -> None:
    with pytest.raises(SamplingParamsError, match=message):
        TextSamplingParams(max_new_tokens=8, extra=extra)


def test_the_edges_sglang_accepts_are_accepted() -> None:
    edge = TextSamplingParams(
        max_new_tokens=1,
        temperature=0,
        top_p=1,
        top_k=1,
        stop=["</s>"],
        stop_token_ids=[0],
        extra={"min_p": 0.0, "repetition_penalty": 2, "min_new_tokens": 1},
    )
    payload = edge.to_payload()
    assert (payload["max_new_tokens"], payload["temperature"], payload["top_p"]) == (1, 0, 1)
    assert payload["top_k"] == 1 and payload["min_p"] == 0.0 and payload["min_new_tokens"] == 1
    assert TextSamplingParams().to_payload()["top_k"] == -1


def test_the_error_is_a_config_error() -> None:
    # The CLI and every config's caller catch ConfigError; SamplingParamsError is one.
    with pytest.raises(ConfigError):
        TextSamplingParams(temperature=-1)
