"""decode_chat_answer: an SGLang chat answer decoded with its per-token lists kept as JSON
text, and read into the same record as the plain JSON value gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from miles_lite.errors import EngineProtocolError
from miles_lite.sglang.chat_wire import PER_TOKEN_FIELDS, decode_chat_answer, record_from_choice

URL = "http://engine:30000"


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def plain_json(value: Any) -> Any:
    """``value`` with each msgspec.Raw read: what the agent receives once it is written."""
    return json.loads(msgspec.json.encode(value))


@pytest.mark.parametrize("name", ["chat_lp_ids.json", "chat_meta_sglext_n2.json"])
def test_an_sglang_answer_keeps_its_per_token_lists_as_json(captures: Path, name: str) -> None:
    data = (captures / name).read_bytes()
    answer = json.loads(data)
    decoded = decode_chat_answer(data)
    assert plain_json(decoded) == answer  # every key and value, written back
    raws = 0
    for choice, plain in zip(decoded["choices"], answer["choices"], strict=True):
        assert choice.keys() == plain.keys()
        for key, value in choice.items():
            if key in PER_TOKEN_FIELDS:
                assert isinstance(value, msgspec.Raw)
                assert msgspec.json.decode(value) == plain[key]
                raws += 1
            else:
                assert value == plain[key] and not isinstance(value, msgspec.Raw)
    assert raws >= 2  # the captures hold logprobs (and prompt and response ids)


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a["choices"][0].__setitem__("tokens_per_second", 9.5),
        lambda a: a.__setitem__("service_tier", "default"),
        lambda a: a.__setitem__("choices", {"0": a["choices"][0]}),
    ],
)
def test_an_answer_with_other_keys_or_shape_is_parsed_whole(captures: Path, edit: Any) -> None:
    answer = json.loads((captures / "chat_lp_ids.json").read_bytes())
    edit(answer)
    decoded = decode_chat_answer(compact(answer))
    assert decoded == answer  # nothing dropped, nothing left as JSON text


@pytest.mark.parametrize(
    "data",
    [b"{not json", b'{"choices": [{"logprobs": NaN}]}', b"[" * 100_000 + b"]" * 100_000],
)
def test_what_is_not_json_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_chat_answer(data)


def echo(prompt: Any, *, raw: bytes | None = None) -> Any:
    """An answer echoing ``prompt`` (or the JSON text ``raw``), decoded as the server does."""
    answer = {
        "choices": [
            {
                "finish_reason": "stop",
                "prompt_token_ids": "@ids@",
                "meta_info": {"output_token_logprobs": [[-0.5, 10, None]]},
            }
        ]
    }
    text = compact(answer).replace(b'"@ids@"', raw if raw is not None else compact(prompt))
    return decode_chat_answer(text)


def read(answer: Any, sent: list[int] | None, vocab_size: int | None = 151_936) -> Any:
    request = {} if sent is None else {"input_ids": sent}
    return record_from_choice(
        answer, rid="r", engine_url=URL, request=request, vocab_size=vocab_size
    )


def test_the_ids_sent_and_echoed_byte_for_byte_are_taken_as_sent() -> None:
    sent = [151644, 872, 198, 9707, 151645]
    record = read(echo(sent), sent)
    assert record.prompt_ids is sent  # nothing decoded: the engine ran what was sent


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        (b"[1, 2, 3]", [1, 2, 3]),  # the same ids, written with spaces
        (b"[1,2,3]", [1, 2, 4]),  # other ids: read, for the caller to compare
        (b"[1,2,3]", None),  # nothing sent as ids (the engine rendered the messages)
        (b"[1,2,3]", [1, 2, object()]),  # not ids at all: no JSON to compare
    ],
)
def test_ids_echoed_otherwise_are_read_and_checked(raw: bytes, sent: list[int] | None) -> None:
    record = read(echo(None, raw=raw), sent)
    assert record.prompt_ids == [1, 2, 3] and record.prompt_ids is not sent


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b"[1,2,99]", r"outside \[0, 50\)"),
        (b"[1,true]", "lacks choices\\[0\\].prompt_token_ids"),
        (b"[1,2.0]", "lacks choices\\[0\\].prompt_token_ids"),
        (b"[]", "lacks choices\\[0\\].prompt_token_ids"),
        (b"null", "lacks choices\\[0\\].prompt_token_ids"),
    ],
)
def test_bad_echoed_ids_are_refused_as_the_plain_value_is(raw: bytes, named: str) -> None:
    decoded = echo(None, raw=raw)
    plain = json.loads(msgspec.json.encode(decoded))
    for answer in (decoded, plain):
        with pytest.raises(EngineProtocolError, match=named):
            read(answer, [1, 2, 3], vocab_size=50)


def test_a_record_is_the_same_from_either_form(captures: Path) -> None:
    data = (captures / "chat_meta_sglext_n2.json").read_bytes()
    answer = json.loads(data)
    answer["choices"] = answer["choices"][:1]
    answer["choices"][0]["prompt_token_ids"] = answer["sglext"]["input_ids"]
    answer["choices"][0]["meta_info"]["id"] = "r"
    data = compact(answer)
    sent = list(answer["sglext"]["input_ids"])
    from_raw = read(decode_chat_answer(data), sent)
    from_plain = read(json.loads(data), sent)
    assert from_raw == from_plain
    assert from_raw.prompt_ids is sent and from_plain.prompt_ids is not sent
