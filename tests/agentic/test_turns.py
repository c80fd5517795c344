"""What the session server sends the engine for an agent's request (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite.agentic.turns import (
    ALLOWED_KEYS,
    ON_POLICY,
    BadTurn,
    appended_messages,
    engine_payload,
    prefix_len,
)
from miles_lite.sglang.sampling import CHAT_NAMES, TextSamplingParams, chat_sampling

MESSAGES = [{"role": "user", "content": "hi"}]
ROLLOUT = chat_sampling(
    TextSamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9).to_payload()
)


def payload(**body: Any) -> dict[str, Any]:
    return engine_payload({"messages": MESSAGES, **body}, ROLLOUT, rid="r1")


def refused(**body: Any) -> BadTurn:
    with pytest.raises(BadTurn) as caught:
        payload(**body)
    return caught.value


def test_the_rollouts_sampling_wins_over_the_agents() -> None:
    asked = dict.fromkeys(ON_POLICY - {"ignore_eos"}, 3)
    sent = payload(**asked, ignore_eos=True)
    assert (sent["temperature"], sent["top_p"]) == (0.7, 0.9)
    for name in CHAT_NAMES.values():
        if name in ON_POLICY:  # the rollout's value, or none when it sets none
            assert sent.get(name) == ROLLOUT.get(name), name
    bare = engine_payload({"messages": MESSAGES, **asked}, {}, rid="r2")
    assert not ON_POLICY & set(bare)  # an agent's value is dropped, never taken
    assert sent["max_tokens"] == 64
    assert sent["rid"] == "r1" and sent["stream"] is False
    assert sent["logprobs"] is True and sent["return_prompt_token_ids"] is True


def test_an_agents_budget_only_lowers_the_rollouts() -> None:
    assert payload(max_tokens=8)["max_tokens"] == 8
    assert payload(max_tokens=1000)["max_tokens"] == 64
    assert payload(max_completion_tokens=5, max_tokens=9)["max_tokens"] == 5
    sent = payload(max_new_tokens=7)
    assert sent["max_tokens"] == 7 and "max_new_tokens" not in sent
    for bad in (0, -1, 2.5, "8", True):
        assert refused(max_tokens=bad).param == "max_tokens"


def test_stop_sequences_and_seeds_are_the_agents() -> None:
    sent = payload(stop=["\n\n"], seed=7, tools=[{"type": "function"}], tool_choice="auto")
    assert (sent["stop"], sent["seed"], sent["tool_choice"]) == (["\n\n"], 7, "auto")


@pytest.mark.parametrize(
    "key", ["custom_logit_processor", "lora_path", "regex", "return_hidden_states", "x"]
)
def test_keys_outside_the_allow_list_are_refused_by_name(key: str) -> None:
    error = refused(**{key: 1})
    assert error.param == key and repr(key) in error.message


def test_n_stream_and_images_are_checked() -> None:
    assert refused(n=3).param == "n"
    assert refused(n=True).param == "n"
    assert payload(n=1)["rid"] == "r1"
    assert refused(stream="false").param == "stream"
    assert payload(stream=True)["stream"] is False  # the server streams its own answer
    image = {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}}
    messages = [{"role": "user", "content": [image]}]
    assert "data URL" in refused(messages=messages).message
    inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert payload(messages=[{"role": "user", "content": [inline]}])["messages"][0]


def test_the_allow_list_covers_the_chat_names_and_on_policy_keys() -> None:
    assert set(CHAT_NAMES.values()) <= ALLOWED_KEYS
    assert ON_POLICY <= ALLOWED_KEYS


def test_appended_messages_need_the_history_and_the_answer_unchanged() -> None:
    answer = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "function": {"name": "add", "arguments": '{"a": 1}'}}],
    }
    # the client echoes the call with another id and re-serialized arguments
    echoed = {
        "role": "assistant",
        "tool_calls": [
            {"id": "b", "type": "function", "function": {"name": "add", "arguments": '{ "a":1 }'}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "b", "content": "2"}
    assert appended_messages(MESSAGES, answer, [*MESSAGES, echoed, tool]) == [tool]
    edited = {**echoed, "tool_calls": [{"function": {"name": "sub", "arguments": "{}"}}]}
    assert appended_messages(MESSAGES, answer, [*MESSAGES, edited, tool]) is None
    other_history = [{"role": "user", "content": "hello"}]
    assert appended_messages(MESSAGES, answer, [*other_history, echoed, tool]) is None
    assert appended_messages(MESSAGES, answer, MESSAGES) is None


def test_prefix_len_trims_at_most_the_bound() -> None:
    trajectory = [1, 2, 3, 9]
    assert prefix_len(trajectory, [1, 2, 3, 9, 5], 1) == 4
    assert prefix_len(trajectory, [1, 2, 3, 5], 1) == 3  # one stop token re-rendered
    assert prefix_len(trajectory, [1, 2, 5], 1) == 0
    assert prefix_len(trajectory, [1, 2, 5], 2) == 2
    assert prefix_len(trajectory, [7, 2, 3], 3) == 0
