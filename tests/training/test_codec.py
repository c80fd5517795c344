"""A sample record comes back as the sample that was recorded: every text field, a loss
mask of ones kept as its length (a smaller record, the same training batch), any other
mask as it was."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from miles_lite.errors import EngineTimeoutError, JournalError
from miles_lite.training import training_batch
from miles_lite.training.codec import RECORD_FIELDS, decode_samples, encode_samples
from miles_lite.training.replay import batch_digest
from miles_lite.types import PrefixCacheInfo, Sample, SampleStatus, SessionInfo, WeightSpan


def text_sample(index: int, mask: list[int] | None) -> Sample:
    n = 6
    return Sample(
        index=index,
        group_index=2,
        prompt="Count:",
        label={"answer": 3},
        status=SampleStatus.TRUNCATED,
        reward=0.25 * index,
        metadata={"prompt_id": 7},
        tokens=[11, 12, 13, *range(100_000, 100_000 + n)],
        response=" six tokens",
        response_length=n,
        loss_mask=mask,
        rollout_log_probs=[-0.1 * (k + 1) / 3 for k in range(n)],
        weight_versions=["v1", "v2"],
        weight_spans=[WeightSpan("v1", 0, 4), WeightSpan("v2", 4, n, kv_version="v1")],
        seed=5,
        finish_reason="length",
        matched_stop=None,
        status_reason=None,
        turns=1,
        request_id="rid",
        non_generation_time=0.5,
        prefix_cache_info=PrefixCacheInfo(cached_tokens=2, total_prompt_tokens=3),
        session=SessionInfo("s", turns=2, tito_mismatches=0),
    )


@pytest.mark.parametrize("mask", [[1] * 6, [1, 1, 0, 0, 1, 1], [0] * 6, None, []], ids=str)
def test_a_text_sample_comes_back_field_for_field(mask: list[int] | None) -> None:
    sample = text_sample(1, mask)
    (back,) = decode_samples(encode_samples([sample]), group_index=2)
    assert back == sample
    assert back.loss_mask == mask and type(back.loss_mask) is type(mask)


def test_a_failed_sample_keeps_its_typed_error() -> None:
    sample = text_sample(0, [1] * 6)
    sample.fail(EngineTimeoutError("read timed out", url="http://e", request_id="rid"))
    (back,) = decode_samples(encode_samples([sample]), group_index=2)
    assert isinstance(back.error, EngineTimeoutError)
    assert (back.error.message, back.error.url, back.error.request_id) == (
        "read timed out",
        "http://e",
        "rid",
    )
    assert dataclasses.replace(back, error=None) == dataclasses.replace(sample, error=None)


def test_a_mask_of_ones_is_kept_as_its_length_and_trains_the_same() -> None:
    ones = [text_sample(k, [1] * 6) for k in range(4)]
    listed = encode_samples([text_sample(0, [1, 1, 1, 1, 1, 0])])
    assert len(encode_samples(ones[:1])) < len(listed)
    back = decode_samples(encode_samples(ones), group_index=2)
    assert back == ones
    assert batch_digest(training_batch([back])) == batch_digest(training_batch([ones]))


@pytest.mark.parametrize(
    "record",
    [[], [1, 2, 3], list(range(40)), {str(k): k for k in range(RECORD_FIELDS)}],
    ids=["empty", "short", "long", "keyed"],
)
def test_a_record_not_of_this_layout_is_a_journal_error(record: object) -> None:
    blob = msgspec.msgpack.encode([record])
    with pytest.raises(JournalError, match="the file is not whole"):
        decode_samples(blob)
