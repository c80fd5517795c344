"""Sample assembly from recorded turns: pure functions over hand-made records."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_lite.agentic.assembly import (
    assemble_samples,
    full_prompts,
    merge_turns,
    status_of,
    truncate_turns,
    turn_samples,
)
from miles_lite.agentic.turns import prefix_len
from miles_lite.errors import ConfigError
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.types import Sample, SampleStatus, WeightSpan


def turn(
    prompt: list[int], output: list[int], finish: str = "stop", version: str = "v1"
) -> TurnRecord:
    return TurnRecord(
        rid=f"r{len(prompt)}",
        engine_url="http://e",
        prompt_ids=prompt,
        output_ids=output,
        output_log_probs=[-0.5 - i for i in range(len(output))],
        finish_reason=finish,
        weight_version=version,
    )


def recorded(*turns: TurnRecord, max_trim: int = 1) -> list[TurnRecord]:
    """The records a session server keeps of these turns (whole prompts): each holds what
    its prompt added to the trajectory so far (``prefix_len``, as the server computes it)."""
    records: list[TurnRecord] = []
    trajectory: list[int] = []
    for record in turns:
        kept = 0
        if records:
            trim = min(max_trim, len(records[-1].output_ids))
            kept = prefix_len(trajectory, record.prompt_ids, trim)
        records.append(
            dataclasses.replace(record, prompt_ids=record.prompt_ids[kept:], prefix_len=kept)
        )
        trajectory = [*record.prompt_ids, *record.output_ids]
    return records


P = [1, 2, 3]
A = [10, 11, 99]  # ends with the end-of-turn token 99
OBS = [20, 21]
B = [30, 31, 99]
TEMPLATE = Sample(index=4, group_index=2, prompt="q", label="5", metadata={"k": 1})


def test_statuses_follow_the_finish_reason() -> None:
    assert status_of("stop") is status_of("tool_calls") is SampleStatus.COMPLETED
    assert status_of("length") is SampleStatus.TRUNCATED
    assert status_of("abort") is SampleStatus.ABORTED
    assert status_of("something new") is SampleStatus.ABORTED


def test_merged_turns_mask_what_lies_between() -> None:
    records = recorded(turn(P, A), turn(P + A + OBS, B, "tool_calls", "v2"))
    result = assemble_samples(records, TEMPLATE, decode=lambda ids: f"<{len(ids)}>")
    (sample,) = result.samples
    assert sample.tokens == P + A + OBS + B
    assert sample.response_length == len(A + OBS + B)
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1]
    assert sample.rollout_log_probs == [-0.5, -1.5, -2.5, 0.0, 0.0, -0.5, -1.5, -2.5]
    assert sample.response == "<3><2><3>"
    assert sample.weight_versions == ["v1", "v2"]
    assert sample.status is SampleStatus.COMPLETED
    assert (sample.index, sample.group_index, sample.prompt, sample.label) == (4, 2, "q", "5")
    assert sample.metadata == {"k": 1}  # the template's, untouched
    assert TEMPLATE.metadata == {"k": 1}  # the template is not changed


def test_per_turn_mode_gives_one_sample_per_turn() -> None:
    records = recorded(turn(P, A), turn(P + A + OBS, B))
    result = assemble_samples(records, TEMPLATE, mode="per_turn")
    assert [s.tokens for s in result.samples] == [P + A, P + A + OBS + B]
    assert [s.loss_mask for s in result.samples] == [[1, 1, 1], [1, 1, 1]]


def test_a_prompt_that_does_not_extend_starts_a_new_sample() -> None:
    rewritten = [1, 2, 3, 55, 10, 11, 99, *OBS]  # the agent rewrote its history
    records = recorded(turn(P, A), turn(rewritten, B), turn(rewritten + B + OBS, [40, 99]))
    result = assemble_samples(records, TEMPLATE)
    assert result.mismatches == 1
    assert [s.tokens for s in result.samples] == [P + A, rewritten + B + OBS + [40, 99]]


def test_trailing_stop_tokens_re_rendered_differently_are_trimmed_within_the_bound() -> None:
    # turn one ended with two stop tokens; the template re-renders only one of them
    first = turn(P, [10, 98, 99])
    records = recorded(first, turn([*P, 10, 98, *OBS], B), max_trim=1)
    result = assemble_samples(records, TEMPLATE)
    (sample,) = result.samples
    assert result.trimmed_tokens == 1 and result.mismatches == 0
    assert sample.tokens == [*P, 10, 98, *OBS, *B]
    assert sample.loss_mask == [1, 1, 0, 0, 1, 1, 1]
    assert len(sample.rollout_log_probs or []) == sample.response_length
    # beyond the bound it is a mismatch, not a trim
    over = assemble_samples(recorded(first, turn([*P, 10, *OBS], B), max_trim=1), TEMPLATE)
    assert over.mismatches == 1 and over.trimmed_tokens == 0
    # and the last turn is never trimmed
    last = assemble_samples(recorded(first, max_trim=2), TEMPLATE)
    assert last.samples[0].tokens == [*P, 10, 98, 99]


def test_merging_stops_at_the_first_turn_not_completed() -> None:
    records = recorded(
        turn(P, A), turn(P + A + OBS, B, "abort"), turn(P + A + OBS + B + OBS, [5, 99])
    )
    (sample,) = assemble_samples(records, TEMPLATE).samples
    assert sample.tokens == P + A + OBS + B and sample.status is SampleStatus.ABORTED
    truncated = assemble_samples(recorded(turn(P, A, "length"), turn(P + A + OBS, B)), TEMPLATE)
    assert [s.tokens for s in truncated.samples] == [P + A]
    assert truncated.samples[0].status is SampleStatus.TRUNCATED


def test_truncation_keeps_whole_turns_and_cuts_the_first_that_overflows() -> None:
    records = recorded(turn(P, A), turn(P + A + OBS, B), turn(P + A + OBS + B + OBS, [5, 6, 99]))
    # turn two is 11 tokens: 9 fit, so 2 of its 3 output tokens go
    (sample,) = assemble_samples(records, TEMPLATE, max_seq_len=9).samples
    assert sample.tokens == P + A + OBS + [30]
    assert sample.status is SampleStatus.TRUNCATED
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1]
    # a turn with nothing left of its output is dropped with every later one
    (kept,) = assemble_samples(records, TEMPLATE, max_seq_len=8).samples
    assert kept.tokens == P + A and kept.status is SampleStatus.COMPLETED
    empty = assemble_samples(records, TEMPLATE, max_seq_len=3)
    assert empty.samples == [] and empty.empty_reason == "all_truncated"
    assert assemble_samples([], TEMPLATE).empty_reason == "no_records"
    with pytest.raises(ConfigError, match="max_seq_len"):
        truncate_turns(turn_samples(records, TEMPLATE), 0)


def test_bad_modes_and_bounds_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="mode"):
        assemble_samples([turn(P, A)], TEMPLATE, mode="tree")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_trim_tokens"):
        assemble_samples([turn(P, A)], TEMPLATE, max_trim_tokens=-1)


@st.composite
def sessions(draw: st.DrawFn) -> list[TurnRecord]:
    """Append-only conversations: each prompt extends the previous prompt and output."""
    tokens = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
    records = []
    for _ in range(draw(st.integers(1, 5))):
        output = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
        records.append(turn(list(tokens), output))
        tokens = tokens + output + draw(st.lists(st.integers(0, 50), max_size=4))
    return recorded(*records)


@given(sessions(), st.sampled_from(["merged", "per_turn"]), st.none() | st.integers(1, 40))
def test_every_sample_keeps_the_per_token_invariants(
    records: list[TurnRecord], mode: str, max_seq_len: int | None
) -> None:
    result = assemble_samples(records, TEMPLATE, mode=mode, max_seq_len=max_seq_len)  # type: ignore[arg-type]
    if max_seq_len is None:
        assert result.mismatches == 0
        assert len(result.samples) == (1 if mode == "merged" else len(records))
    for sample in result.samples:
        assert len(sample.loss_mask or []) == sample.response_length
        assert len(sample.rollout_log_probs or []) == sample.response_length
        assert 0 < sample.response_length < len(sample.tokens)
        assert max_seq_len is None or len(sample.tokens) <= max_seq_len
    if mode == "merged" and max_seq_len is None:
        last_prompt = list(full_prompts(records))[-1]
        assert result.samples[0].tokens == last_prompt + records[-1].output_ids
        assert sum(result.samples[0].loss_mask or []) == sum(len(r.output_ids) for r in records)


def test_merging_records_in_place_gives_what_merging_turn_samples_gives() -> None:
    """assemble_samples reads records in place (no per-turn copy of the history); it must
    agree with merge_turns over turn_samples, trims, mismatches and a last turn included."""

    def decode(ids: list[int]) -> str:
        return ",".join(map(str, ids))

    sessions = [
        recorded(turn(P, A), turn(P + A + OBS, B), turn(P + A + OBS + B + OBS, A, "length")),
        recorded(turn(P, A), turn([*P, 10, 11, 98, *OBS], B)),  # stop re-rendered: trim 1
        recorded(turn(P, A), turn([9, *P], B), turn([9, *P, *B, *OBS], A)),  # rewritten
        recorded(turn(P, A, "abort"), turn(P + A + OBS, B)),  # stops after one not COMPLETED
    ]
    for records in sessions:
        before = copy.deepcopy(records)
        fast = assemble_samples(records, TEMPLATE, decode=decode)
        assert records == before  # read, never changed
        slow = merge_turns(turn_samples(records, TEMPLATE, decode=decode), decode=decode)
        assert (fast.mismatches, fast.trimmed_tokens) == (slow.mismatches, slow.trimmed_tokens)
        assert len(fast.samples) == len(slow.samples)
        for a, b in zip(fast.samples, slow.samples, strict=True):
            a.metadata = b.metadata = {}
            assert a == b


def test_merged_spans_keep_their_kv_marks_at_each_turns_offset() -> None:
    first = dataclasses.replace(
        turn([1, 2], [10, 11, 12]),
        weight_spans=(WeightSpan("v0", 0, 1), WeightSpan("v1", 1, 3, kv_version="v0")),
    )
    second = dataclasses.replace(
        turn([1, 2, 10, 11, 12, 20], [30, 31]),
        weight_spans=(WeightSpan("v1", 0, 1, kv_version="v0"), WeightSpan("v2", 1, 2)),
    )
    (sample,) = assemble_samples(recorded(first, second), Sample(prompt="p")).samples
    assert sample.loss_mask == [1, 1, 1, 0, 1, 1]
    assert sample.weight_spans == [
        WeightSpan("v0", 0, 1),
        WeightSpan("v1", 1, 3, kv_version="v0"),
        WeightSpan("v1", 4, 5, kv_version="v0"),  # the mark survives the offset
        WeightSpan("v2", 5, 6),
    ]
