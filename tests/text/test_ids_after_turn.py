"""Token in's text after a model turn: at most one worker-thread hop a turn, none once the
template's glue is proven and the text is short, and the same ids either way (the real
Qwen3 tokenizer and template of the stand-in)."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite.testing import load_qwen3_tokenizer
from miles_lite.text.template_glue import TemplateGlue, render_after_turn
from miles_lite.text.tokenize import ON_LOOP_CHARS, ids_after_turn
from tests.support.hop_counting import HopCountingContext

pytestmark = pytest.mark.anyio

END = "<|im_end|>"


@pytest.fixture
def context() -> HopCountingContext:
    return HopCountingContext(tokenizer=load_qwen3_tokenizer(), router=None)  # type: ignore[arg-type]


def full_ids(tokenizer: Any, messages: list[dict[str, Any]], turn_ended: bool) -> list[int]:
    """What the full render gives, encoded: the oracle (the model's own end left out)."""
    text = render_after_turn(tokenizer, messages)
    if turn_ended and text.startswith(END):
        text = text[len(END) :]
    return list(tokenizer.encode(text, add_special_tokens=False))


def tool_result(content: str) -> list[dict[str, Any]]:
    return [{"role": "tool", "content": content}, {"role": "user", "content": "Go on."}]


async def test_a_proven_shape_is_encoded_on_the_loop_without_a_hop(
    context: HopCountingContext,
) -> None:
    glue = TemplateGlue(context.tokenizer)
    contents = ["5", " \n x \n", "<tool_response>", "日本", "result 7"]
    for i, content in enumerate(contents):
        for turn_ended in (True, False):
            messages = tool_result(content)
            ids = await ids_after_turn(
                context.threads, glue, messages, end_of_turn=END, turn_ended=turn_ended
            )
            assert ids == full_ids(context.tokenizer, messages, turn_ended), (content, turn_ended)
            # the first call derives and proves the glue in one hop; every later one
            # joins the proven glue and encodes on the loop
            assert context.hops == 1, (i, turn_ended)
    assert glue.rendered == 3  # two sentinel renders and the proof, once
    assert glue.glued == 2 * len(contents) - 1


async def test_long_text_is_encoded_in_one_hop_even_when_glued(
    context: HopCountingContext,
) -> None:
    glue = TemplateGlue(context.tokenizer)
    await ids_after_turn(context.threads, glue, tool_result("5"), end_of_turn=END, turn_ended=True)
    assert context.hops == 1
    long = tool_result("word " * ON_LOOP_CHARS)
    ids = await ids_after_turn(context.threads, glue, long, end_of_turn=END, turn_ended=True)
    assert ids == full_ids(context.tokenizer, long, True)
    assert context.hops == 2  # the encoding only: the glue is not rendered again
    assert glue.rendered == 3


async def test_a_message_the_glue_cannot_carry_takes_one_hop_each_time(
    context: HopCountingContext,
) -> None:
    glue = TemplateGlue(context.tokenizer)
    named = [{"role": "user", "content": "hi", "name": "bob"}]
    for turn in range(1, 4):
        ids = await ids_after_turn(context.threads, glue, named, end_of_turn=END, turn_ended=True)
        assert ids == full_ids(context.tokenizer, named, True)
        assert context.hops == turn
    assert glue.glued == 0


def test_proven_text_never_renders() -> None:
    tokenizer = load_qwen3_tokenizer()
    glue = TemplateGlue(tokenizer)
    messages = tool_result("5")
    assert glue.proven_text(messages) is None  # not derived yet: no render to find out
    assert (glue.rendered, glue.glued) == (0, 0)
    glue.text_after_turn(messages)
    assert (glue.rendered, glue.glued) == (3, 0)
    later = tool_result("7")
    assert glue.proven_text(later) == render_after_turn(tokenizer, later)
    assert glue.proven_text(later, {"enable_thinking": False}) is None  # another key
    assert (glue.rendered, glue.glued) == (3, 1)
