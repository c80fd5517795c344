from __future__ import annotations

import pytest

from miles_lite.errors import GenerateError
from miles_lite.text.metrics import text_metrics
from miles_lite.types import Sample, SampleStatus, SessionInfo


def sample(
    group: int, length: int, reward: float | dict[str, float] | None, **kw: object
) -> Sample:
    s = Sample(
        group_index=group, response_length=length, reward=reward, status=SampleStatus.COMPLETED
    )
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def test_lengths_are_effective_and_failed_samples_are_left_out() -> None:
    samples = [
        sample(0, 4, 1.0, loss_mask=[1, 1, 0, 0]),
        sample(0, 6, 0.0),
        sample(1, 99, None),
    ]
    samples[2].fail(GenerateError("x"))
    m = text_metrics(samples, rollout_time_s=2.0)
    assert m["rollout/response_len/mean"] == 4.0
    assert (m["rollout/response_len/min"], m["rollout/response_len/max"]) == (2.0, 6.0)
    assert m["perf/tokens_per_sec"] == 5.0 and m["perf/effective_tokens_per_sec"] == 4.0
    assert [s.effective_response_length for s in samples[:2]] == [2, 6]


def test_truncated_ratio_and_zero_std_groups_by_reward_key() -> None:
    samples = [
        sample(0, 1, {"acc": 1.0}, status=SampleStatus.TRUNCATED),
        sample(0, 1, {"acc": 1.0}),
        sample(1, 1, {"acc": 0.0}),
        sample(1, 1, {"acc": 0.0}),
        sample(2, 1, {"acc": 1.0}),
        sample(2, 1, {"acc": 0.0}),
    ]
    m = text_metrics(samples, reward_key="acc")
    assert m["rollout/truncated_ratio"] == pytest.approx(1 / 6)
    assert m["rollout/zero_std/count_1.0"] == 1 and m["rollout/zero_std/count_0.0"] == 1
    assert m["rollout/zero_std/all_one_percentage"] == pytest.approx(1 / 3)


def test_weight_versions_and_tito_mismatches() -> None:
    samples = [
        sample(
            0,
            1,
            None,
            weight_versions=["3", "4"],
            session=SessionInfo("a", turns=2, tito_mismatches=1),
        ),
        sample(0, 1, None, weight_versions=["4"], session=SessionInfo("b", turns=1)),
    ]
    m = text_metrics(samples)
    assert m["rollout/weight_version/mixed_version_ratio"] == 0.5
    assert (m["rollout/weight_version/min"], m["rollout/weight_version/max"]) == (3.0, 4.0)
    assert m["rollout/tito_session_mismatch_rate"] == 0.5
