"""Messages requests in chat terms and chat answers in Messages terms: pure translations."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite.agentic.messages_wire import (
    chat_body,
    messages_answer,
    messages_error,
    messages_events,
)
from miles_lite.agentic.turns import BadTurn


def test_a_tool_exchange_with_a_system_prompt_becomes_the_chat_exchange() -> None:
    body = {
        "model": "m",
        "max_tokens": 32,
        "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"],
        "tool_choice": {"type": "tool", "name": "add"},
        "thinking": {"type": "disabled"},
        "tools": [{"name": "add", "description": "Add.", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "add 2 and 3"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 2, "b": 3}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "5"},
                    {"type": "text", "text": "Thanks"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                    },
                ],
            },
        ],
    }
    chat = chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Thanks"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
    ]
    assert (chat["max_tokens"], chat["stop"], chat["model"]) == (32, ["END"], "m")
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "parameters": {"type": "object"}, "description": "Add."},
        }
    ]
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [], "logit_bias": {}}, "logit_bias"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url"}}]}
                ]
            },
            "messages",
        ),
        ({"messages": [], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"messages": [], "thinking": {"type": "maybe"}}, "thinking"),
    ],
)
def test_what_cannot_be_translated_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadTurn) as caught:
        chat_body(body)
    assert caught.value.param == param


def chat_answer(finish: str, **message: Any) -> dict[str, Any]:
    return {
        "id": "r1",
        "choices": [{"message": message, "finish_reason": finish, "matched_stop": "END"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
        "metadata": {"weight_version": "1"},
    }


def test_a_chat_answer_becomes_a_messages_answer_and_its_events() -> None:
    call = {"id": "c1", "function": {"name": "add", "arguments": '{"a": 2}'}}
    message = messages_answer(
        chat_answer("tool_calls", content="Sure.", tool_calls=[call]), model="m"
    )
    assert message["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 2}},
    ]
    assert (message["stop_reason"], message["usage"]) == (
        "tool_use",
        {"input_tokens": 9, "output_tokens": 4},
    )
    assert message["metadata"] == {"weight_version": "1"}
    stopped = messages_answer(chat_answer("stop", content="x"), model="m", stop=["END"])
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    assert messages_answer(chat_answer("length", content="x"), model="m")["stop_reason"] == (
        "max_tokens"
    )
    names = [e.split(b"\n", 1)[0] for e in messages_events(message)]
    assert names == [
        b"event: message_start",
        *[
            b"event: content_block_start",
            b"event: content_block_delta",
            b"event: content_block_stop",
        ]
        * 2,
        b"event: message_delta",
        b"event: message_stop",
    ]


def test_an_openai_error_becomes_a_messages_error() -> None:
    error = {"error": {"message": "no", "type": "invalid_request_error", "param": "x"}}
    assert messages_error(error) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "no"},
    }
