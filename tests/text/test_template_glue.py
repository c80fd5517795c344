"""The template's per-role glue gives, token for token, what the full Jinja render gives
after a model turn (the real Qwen3 template of the stand-in's tokenizer files, and Llama
4's as transformers ships it), and falls back to the full render where it must."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer
from transformers.models.llama4.processing_llama4 import chat_template as LLAMA4

from miles_lite.testing import load_qwen3_tokenizer, qwen3_tokenizer_dir
from miles_lite.text.template_glue import TemplateGlue, render_after_turn


def with_template(template: str | None) -> Any:
    """The stand-in's Qwen3 tokenizer; a copy with ``template`` when one is given (the
    loaded tokenizer is shared by every test)."""
    if template is None:
        return load_qwen3_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    tokenizer.chat_template = template
    return tokenizer


#: The stand-in's Qwen3 tokenizer with its own template, and with Llama 4's.
TOKENIZERS = {"qwen3": with_template(None), "llama4": with_template(LLAMA4)}
#: The roles whose content each template does not put in verbatim.
REWRITES = {TOKENIZERS["qwen3"].chat_template: set(), LLAMA4: {"tool"}}

#: Text a template might branch on, edge whitespace, markup, and plain words.
PIECES = st.sampled_from(
    [
        "",
        " ",
        "\n",
        "\n\n",
        "hi",
        "5",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|im_end|>",
        '{"a": 1}',
        "日本",
        "\u2060",
        "  x  ",
    ]
)
CONTENT = st.lists(PIECES, max_size=6).map("".join)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "system"]), "content": CONTENT}
)
EXCHANGE = st.lists(MESSAGE, min_size=1, max_size=4)
KWARGS = st.sampled_from([None, {"enable_thinking": False}, {"enable_thinking": True}])


@pytest.fixture(params=sorted(TOKENIZERS), scope="module")
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return TOKENIZERS[request.param]


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@settings(max_examples=150, deadline=None)
@given(exchanges=st.lists(EXCHANGE, min_size=1, max_size=4), kwargs=KWARGS)
def test_the_glued_text_is_the_full_render_token_for_token(
    tokenizer: Any, exchanges: list[list[dict[str, Any]]], kwargs: dict[str, Any] | None
) -> None:
    glue = TemplateGlue(tokenizer)
    for messages in [*exchanges, *exchanges]:  # the second pass runs on proven glue
        want = render_after_turn(tokenizer, messages, kwargs)
        got = glue.text_after_turn(messages, kwargs)
        assert got == want
        assert ids(tokenizer, got) == ids(tokenizer, want)
    # a role sequence costs two sentinel renders and one proof, then is glued; one with
    # a role whose content the template rewrites (Llama 4's tool: tojson) fails its first
    # sentinel render and is rendered in full every time
    rewritten = REWRITES[tokenizer.chat_template]
    shapes = Counter(tuple(m["role"] for m in x) for x in exchanges)
    glued = {shape: n for shape, n in shapes.items() if not rewritten.intersection(shape)}
    assert glue.glued == sum(2 * n - 1 for n in glued.values())
    assert glue.rendered == sum(3 if shape in glued else 1 + 2 * n for shape, n in shapes.items())


def test_a_repeated_shape_is_glued_without_the_template(tokenizer: Any) -> None:
    glue = TemplateGlue(tokenizer)
    result = "user" if "tool" in REWRITES[tokenizer.chat_template] else "tool"
    first = [{"role": result, "content": "5"}, {"role": "user", "content": "And now?"}]
    glue.text_after_turn(first)
    assert (glue.rendered, glue.glued) == (3, 0)  # two sentinel renders and the proof
    for content in ("7", "\n x \n", "<tool_response>"):
        later = [{"role": result, "content": content}, {"role": "user", "content": "Go"}]
        assert glue.text_after_turn(later) == render_after_turn(tokenizer, later)
    assert (glue.rendered, glue.glued) == (3, 3)


@pytest.mark.parametrize(
    "message",
    [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
            ],
        },
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": None},
    ],
    ids=["tool_calls", "name", "list content", "no content"],
)
def test_a_message_the_glue_cannot_carry_is_rendered_in_full(
    tokenizer: Any, message: dict[str, Any]
) -> None:
    glue = TemplateGlue(tokenizer)
    messages = [{"role": "user", "content": "x"}, message]
    try:
        want = render_after_turn(tokenizer, messages)
    except Exception as exc:  # Qwen3 refuses list content: so does the glue, each time
        for _ in range(2):
            with pytest.raises(type(exc)):
                glue.text_after_turn(messages)
    else:
        for _ in range(2):
            assert glue.text_after_turn(messages) == want
    assert (glue.rendered, glue.glued) == (2, 0)


def test_a_template_that_trims_content_is_never_glued() -> None:
    tokenizer = with_template(
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    glue = TemplateGlue(tokenizer)
    messages = [{"role": "user", "content": " padded "}]
    for _ in range(3):
        assert glue.text_after_turn(messages) == render_after_turn(tokenizer, messages)
    assert glue.glued == 0
    assert glue.rendered == 1 + 3  # the sentinel render that failed, then every call


def test_a_template_that_branches_on_content_fails_its_proof_and_renders_in_full() -> None:
    tokenizer = with_template(
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.content == 'secret' %}[hidden]{%- else %}{{ m.content }}{%- endif %}"
        "<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    glue = TemplateGlue(tokenizer)
    messages = [{"role": "user", "content": "secret"}]
    for _ in range(3):
        assert glue.text_after_turn(messages) == render_after_turn(tokenizer, messages)
    assert glue.glued == 0
    assert glue.rendered == 2 + 1 + 2  # sentinels, the failed proof, then in full


def test_a_field_the_template_names_is_rendered_in_full() -> None:
    tokenizer = with_template(
        "{%- for m in messages %}<|im_start|>{{ m.role }}{{ m.tool_call_id or '' }}\n"
        "{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    glue = TemplateGlue(tokenizer)
    messages = [{"role": "tool", "content": "5", "tool_call_id": "call_1"}]
    for _ in range(2):
        assert glue.text_after_turn(messages) == render_after_turn(tokenizer, messages)
    assert glue.glued == 0
