"""Streamed tokens into the journal (``JournalConfig.stream_tokens_every``): a sample in
flight when the rollout dies resumes from its last recorded token through the
partial-rollout path, so only the tokens after it are generated again."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from miles_lite import SampleStatus
from miles_lite.errors import ConfigError, EngineProtocolError
from miles_lite.rollout.groups import PromptGroup
from miles_lite.sglang.generate_stream import decode_generate_stream, parse_stream_chunk
from miles_lite.training import Journal, JournalConfig, read_resume

from .conftest import Journaled

pytestmark = pytest.mark.anyio

CAPTURES = Path(__file__).parent.parent / "data" / "sglang_captures"


def prompts(n: int) -> list[PromptGroup]:
    return [PromptGroup(prompt=f"count to {i}", metadata={"prompt_id": i}) for i in range(n)]


async def test_a_sample_in_flight_at_a_crash_resumes_from_its_last_streamed_token(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    answer = 48
    config = JournalConfig(stream_tokens_every=8)
    async with Journal(path, config) as journal:
        async with journaled(journal, answer_tokens=answer, token_latency_s=0.004) as (
            rollout,
            engine,
        ):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(rollout.run, prompts(2))
                    # Die once each of the 4 samples recorded at least 2 chunks of 8 tokens.
                    while journal.progress_written < 8:  # noqa: ASYNC110 (a plain counter)
                        await anyio.sleep(0.005)
                    scope.cancel()  # the process dies: no call ends, nothing handed
            sent = engine.statistics().requests
            assert len(sent) == 4 and all(body["stream"] is True for body in sent)
            assert all(body["sampling_params"]["stream_interval"] == 8 for body in sent)
        assert journal.progress_skipped == 0
    state = await anyio.to_thread.run_sync(read_resume, path)
    resumed = [s for g in state.pending for s in g]
    assert len(resumed) == 4
    kept = [s.response_length for s in resumed]
    assert all(s.status is SampleStatus.ABORTED and s.status_reason == "in_flight" for s in resumed)
    # Chunks hold 1 token, then 8 more each (as SGLang's): records at 9, 17, ...
    assert all(9 <= n < answer and n % 8 == 1 for n in kept)
    for s in resumed:
        assert len(s.rollout_log_probs) == s.response_length == sum(s.loss_mask)
        assert all(lp <= 0.0 for lp in s.rollout_log_probs)
        assert [(w.start, w.end) for w in s.weight_spans] == [(0, s.response_length)]
    prefixes = [list(s.tokens) for s in resumed]
    async with journaled(path, answer_tokens=answer) as (rollout, engine):
        state = await rollout.resume()
        result = await rollout.run(state.pending)
        bodies = engine.statistics().requests
    done = [s for g in result.groups for s in g]
    assert len(done) == 4
    by_prefix = {tuple(p[:8]): p for p in prefixes}
    for s in done:
        prefix = by_prefix[tuple(s.tokens[:8])]
        assert s.tokens[: len(prefix)] == prefix  # extends its journaled prefix
    # Each resume request carries the recorded output and asks only for what is left.
    asked = sorted(b["sampling_params"]["max_new_tokens"] for b in bodies)
    assert asked == sorted(answer + 1 - n for n in kept)
    # Tokens made again on resume: only those after the recorded prefix (the stand-in
    # answers `answer` new tokens within the budget left). Without the option these 4
    # samples had no record and would be made again from their prompts: 4 x answer.
    regenerated = sum(s.response_length for s in done) - sum(kept)
    assert regenerated == sum(min(answer, answer + 1 - n) for n in kept)
    assert sum(kept) >= 32 and regenerated <= 4 * answer - sum(kept) + 4


def test_the_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="stream_tokens_every"):
        JournalConfig(stream_tokens_every=0)
    with pytest.raises(ConfigError, match="stream_tokens_every"):
        JournalConfig(stream_tokens_every=True)  # type: ignore[arg-type]


def test_streamed_chunks_pass_the_answer_checks() -> None:
    body = (CAPTURES / "gen_stream.txt").read_bytes()
    rid = "e5085d231bcd4c569770ecc4646b36db"
    answer = decode_generate_stream(body, rid=rid)
    assert answer.ids == [213, 303, 233] and answer.status is SampleStatus.TRUNCATED
    first = body.split(b"\n\n")[0][len(b"data: ") :]
    partial = parse_stream_chunk(first, rid=rid)
    assert partial.ids == [213] and partial.status is SampleStatus.ABORTED
    with pytest.raises(EngineProtocolError, match="output_token_logprobs"):
        parse_stream_chunk(first.replace(b"-5.474", b"5.474"), rid=rid)
    with pytest.raises(EngineProtocolError, match=r"meta_info\.id"):
        parse_stream_chunk(first, rid="0" * 32)
    with pytest.raises(EngineProtocolError, match="mid-stream"):
        parse_stream_chunk(b'{"error": {"message": "oom"}}', rid=rid)
    with pytest.raises(EngineProtocolError, match="DONE"):
        decode_generate_stream(body.replace(b"data: [DONE]", b""), rid=rid)


async def test_recorded_output_keeps_the_version_of_each_chunk_across_an_update(
    tmp_path: Path, journaled: Journaled
) -> None:
    path = tmp_path / "run.db"
    journal = Journal(path, JournalConfig(stream_tokens_every=8))
    async with (
        journal,
        journaled(journal, answer_tokens=64, token_latency_s=0.004) as (rollout, _),
    ):
        await rollout.update_weights(None, version="v0")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(rollout.run, prompts(1))
                while journal.progress_written < 2:  # noqa: ASYNC110 (a plain counter)
                    await anyio.sleep(0.002)
                await rollout.update_weights(None, version="v1")
                seen = journal.progress_written
                while journal.progress_written < seen + 4:  # noqa: ASYNC110
                    await anyio.sleep(0.002)
                scope.cancel()
    state = await anyio.to_thread.run_sync(read_resume, path)
    resumed = [s for g in state.pending for s in g]
    assert len(resumed) == 2
    for s in resumed:
        versions = [w.version for w in s.weight_spans]
        assert versions == ["v0", "v1"], s.weight_spans
        assert s.weight_spans[0].start == 0 and s.weight_spans[-1].end == s.response_length
        assert s.weight_spans[0].end == s.weight_spans[1].start


async def test_a_slow_stream_is_recorded_by_time_before_the_token_count(
    tmp_path: Path, journaled: Journaled
) -> None:
    # 40 tokens at 10 ms each: a record every 1000 tokens never comes, one every 30 ms
    # does. Chunks of 2 tokens (>= 20 ms apart), so between two records at most 2 chunks.
    answer, path = 40, tmp_path / "run.db"
    config = JournalConfig(stream_tokens_every=1000, stream_tokens_ms=30, stream_chunk_tokens=2)
    async with Journal(path, config) as journal:
        async with journaled(journal, answer_tokens=answer, token_latency_s=0.01) as (
            rollout,
            engine,
        ):
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(rollout.run, prompts(1))
                    while journal.progress_written < 4:  # noqa: ASYNC110 (a plain counter)
                        await anyio.sleep(0.005)
                    scope.cancel()
            sent = engine.statistics().requests
            assert len(sent) == 2
            assert all(body["sampling_params"]["stream_interval"] == 2 for body in sent)
        assert journal.progress_skipped == 0
    state = await anyio.to_thread.run_sync(read_resume, path)
    resumed = [s for g in state.pending for s in g]
    kept = [s.response_length for s in resumed if s.status_reason == "in_flight"]
    # Recorded at chunk ends (1, 3, 5, ...): by time, far below the count of 1000.
    assert kept and all(n % 2 == 1 and n <= answer for n in kept)

    # Run to its end: each sample was recorded by time (its last in-flight chunk comes
    # >= 390 ms after its request began), and at most once a chunk.
    path = tmp_path / "again.db"
    async with Journal(path, config) as journal:
        async with journaled(journal, answer_tokens=answer, token_latency_s=0.01) as (
            rollout,
            _,
        ):
            result = await rollout.run(prompts(1))
        made = [s.response_length for g in result.groups for s in g]
        assert made == [answer + 1, answer + 1]  # the stand-in's answer and its stop token
        # 21 chunks a sample (1, 3, ..., 41), the last one the whole answer
        assert 2 <= journal.progress_written <= 2 * 20
    # The count alone (no time): a 40-token answer is never recorded in flight.
    path = tmp_path / "count.db"
    async with Journal(path, JournalConfig(stream_tokens_every=1000)) as journal:
        async with journaled(journal, answer_tokens=answer, token_latency_s=0.01) as (
            rollout,
            engine,
        ):
            await rollout.run(prompts(1))
            sent = engine.statistics().requests
        assert all(body["sampling_params"]["stream_interval"] == 1000 for body in sent)
        assert journal.progress_written == 0


def test_the_time_option_is_checked() -> None:
    assert JournalConfig(stream_tokens_ms=50).streams
    assert not JournalConfig().streams
    for bad in (0, -1.0, float("nan"), float("inf"), True, "50"):
        with pytest.raises(ConfigError, match="stream_tokens_ms"):
            JournalConfig(stream_tokens_ms=bad)  # type: ignore[arg-type]
    for bad_chunk in (0, 1.5, False):
        with pytest.raises(ConfigError, match="stream_chunk_tokens"):
            JournalConfig(stream_chunk_tokens=bad_chunk)  # type: ignore[arg-type]
