"""``encode_text`` gives the ids ``tokenizer.encode(text, add_special_tokens=False)`` gives:
through the Rust backend directly where that is the same call, through the tokenizer
otherwise (special tokens split, truncation or padding set on the backend, a class that
encodes its own way, a tokenizer that is not transformers')."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from miles_lite.testing.tokenizers import qwen3_tokenizer_dir
from miles_lite.text.tokenize import _plain_backend, encode_text

TEXTS = [
    "",
    "result 7",
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n",
    "  leading and trailing spaces  \n\n\n\t tabs",
    "日本語のテキスト and emoji 🙂🙂 mixed",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<|im_start|> not alone<|im_end|>x<|endoftext|>",
    "def f(x):\n    return x ** 2  # code\n" * 40,
]


@pytest.fixture
def tokenizer() -> Any:
    """A tokenizer of this test's own (the tests change its settings)."""
    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def reference(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_the_backend_is_called_directly_and_gives_the_same_ids(tokenizer: Any) -> None:
    assert _plain_backend(tokenizer) is tokenizer.backend_tokenizer
    for text in TEXTS:
        ids = encode_text(tokenizer, text)
        assert type(ids) is list and ids == reference(tokenizer, text), text


def test_special_tokens_split_as_the_tokenizer_says(tokenizer: Any) -> None:
    tokenizer.split_special_tokens = True
    assert _plain_backend(tokenizer) is None
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = encode_text(tokenizer, text)
    assert ids == reference(tokenizer, text)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in ids  # split, as asked


def test_a_backend_set_to_truncate_or_pad_is_not_called_directly(tokenizer: Any) -> None:
    text = TEXTS[-1]
    full = encode_text(tokenizer, text)
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)
    assert _plain_backend(tokenizer) is None
    assert encode_text(tokenizer, text) == full  # transformers' encode does not truncate
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.backend_tokenizer.enable_padding(length=4096)
    assert _plain_backend(tokenizer) is None
    assert encode_text(tokenizer, text) == full


def test_a_class_that_encodes_its_own_way_is_asked(tokenizer: Any) -> None:
    class Shouting(type(tokenizer)):  # type: ignore[misc]
        def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
            return list(super().encode(text.upper(), *args, **kwargs))

    tokenizer.__class__ = Shouting
    assert _plain_backend(tokenizer) is None
    assert encode_text(tokenizer, "abc") == reference(tokenizer, "abc")


def test_a_tokenizer_that_is_not_transformers_is_asked() -> None:
    class Bytes:
        def encode(self, text: str, add_special_tokens: bool = True) -> tuple[int, ...]:
            return tuple(text.encode())

    assert _plain_backend(Bytes()) is None
    assert encode_text(Bytes(), "ab") == [97, 98]


CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": text}] for text in TEXTS if text
] + [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n5"},
        {"role": "user", "content": "And 2+4? <|im_end|> stays a token"},
    ],
    [
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
    ],
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
        },
    }
]


@pytest.mark.anyio
@pytest.mark.parametrize("split", [False, True])
async def test_chat_prompt_ids_are_the_templates_own_tokenize(tokenizer: Any, split: bool) -> None:
    # prompt_ids renders, then encodes the text: what apply_chat_template(tokenize=True)
    # gives, with special tokens split or not as the tokenizer says.
    from miles_lite.text.context import TextContext
    from miles_lite.text.tokenize import prompt_ids

    tokenizer.split_special_tokens = split
    ctx = TextContext(tokenizer=tokenizer, router=None)  # type: ignore[arg-type]
    for chat in CHATS:
        for tools in (None, TOOLS):
            want = tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True)
            got = await prompt_ids(ctx, chat, tools=tools)
            assert type(got) is list and got == list(want["input_ids"]), (chat, tools)
