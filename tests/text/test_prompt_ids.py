"""A group's prompt is tokenized once (``TextContext.recent_prompts``): its samples share
the first one's call, told apart by content, never by the object; a failed call is never
shared. Over a real stand-in engine on loopback and the real Qwen3 tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from miles_lite import SampleStatus
from miles_lite.errors import SampleInvariantError
from miles_lite.text import tokenize
from miles_lite.text.context import RECENT_PROMPT_IDS
from tests.text.conftest import OpenRollout

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


@pytest.fixture
def tokenized(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The prompts the tokenizer was asked for, one entry a call (the real call made)."""
    calls: list[Any] = []
    real = tokenize.prompt_ids

    async def counted(ctx: Any, prompt: Any, **kwargs: Any) -> list[int]:
        calls.append(prompt if isinstance(prompt, str) else [dict(m) for m in prompt])
        return await real(ctx, prompt, **kwargs)

    monkeypatch.setattr(tokenize, "prompt_ids", counted)
    return calls


def _template_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


async def test_a_groups_samples_tokenize_their_prompt_once(
    text_rollout: OpenRollout, tokenizer: Any, tokenized: list[Any]
) -> None:
    chat = [SYSTEM, {"role": "user", "content": "What is 2+3?"}]
    other = [SYSTEM, {"role": "user", "content": "What is 2+3? Show your work."}]
    async with text_rollout(n_samples_per_prompt=4) as (rollout, (engine,)):
        result = await rollout.run([chat, "What is 2+3?", other])
        memo = rollout.context.recent_prompts
        assert (memo.calls, memo.shared) == (3, 9)
    assert len(tokenized) == 3
    want = [
        _template_ids(tokenizer, chat),
        tokenizer.encode("What is 2+3?", add_special_tokens=False),
        _template_ids(tokenizer, other),
    ]
    # Kept as arrays, counted in ids against RECENT_PROMPT_IDS.
    assert memo.kept_cost == sum(map(len, want)) < RECENT_PROMPT_IDS
    sent = [r["input_ids"] for r in engine.stats.requests]
    assert sorted(map(tuple, sent)) == sorted(tuple(ids) for ids in want for _ in range(4))
    for group, ids in zip(result.groups, want, strict=True):
        assert all(s.status is SampleStatus.COMPLETED for s in group)
        assert all(s.tokens[: len(ids)] == ids for s in group)
        # Each sample owns its token list: extending one changes no other.
        assert len({id(s.tokens) for s in group}) == 4


async def test_a_prompt_changed_in_place_between_runs_is_tokenized_again(
    text_rollout: OpenRollout, tokenizer: Any, tokenized: list[Any]
) -> None:
    chat = [{"role": "user", "content": "What is 2+3?"}]
    async with text_rollout(n_samples_per_prompt=2) as (rollout, (engine,)):
        await rollout.run([chat])
        first = list(tokenized[0])
        chat.append({"role": "assistant", "content": "It is 5."})
        chat.append({"role": "user", "content": "What is 2+3? Say it again."})
        await rollout.run([chat])
        # Equal content, a new object: the kept ids, no call.
        await rollout.run([[dict(m) for m in chat]])
    assert tokenized == [first, chat]
    sent = [r["input_ids"] for r in engine.stats.requests]
    assert sent[2:] == [_template_ids(tokenizer, chat)] * 4
    assert sent[0] != sent[2]


async def test_types_that_render_apart_are_told_apart(
    text_rollout: OpenRollout, tokenized: list[Any]
) -> None:
    # 1 and True are equal in Python and render apart in a template: never one key.
    one = [{"role": "user", "content": "What is 2+3?", "n": 1}]
    true = [{"role": "user", "content": "What is 2+3?", "n": True}]
    async with text_rollout(n_samples_per_prompt=1) as (rollout, _):
        await rollout.run([one, true])
    assert len(tokenized) == 2


async def test_a_failed_call_is_not_shared_each_sample_fails_on_its_own(
    text_rollout: OpenRollout, tokenizer: Any, tokenized: list[Any]
) -> None:
    ok, bad = "What is 2+3?", "What is 2+3? Show your work, carefully."
    ok_top = max(tokenizer.encode(ok, add_special_tokens=False))
    bad_top = max(tokenizer.encode(bad, add_special_tokens=False))
    assert ok_top < bad_top
    async with text_rollout(n_samples_per_prompt=3, vocab_size=ok_top + 1) as (rollout, engines):
        result = await rollout.run([ok, bad])
        assert rollout.context.recent_prompts.calls == 1 + 3
    # The good prompt's samples were sent (the stand-in's answers then hold ids above the
    # small vocabulary: those fail on their own); the bad one's never were.
    (engine,) = engines
    ok_ids = tokenizer.encode(ok, add_special_tokens=False)
    assert [r["input_ids"] for r in engine.stats.requests] == [ok_ids] * 3
    failed = result.groups[1]
    for sample in failed:
        assert sample.status is SampleStatus.FAILED
        assert isinstance(sample.error, SampleInvariantError)
        assert str(sample.error).startswith(f"sample {sample.index}: prompt ids[")
    assert len(tokenized) == 4
