from __future__ import annotations

import dataclasses

import pytest

from miles_lite.testing import OPTIONAL_GROUPS, Faults, StandInConfig


def test_defaults_are_valid_and_speak_msgpack() -> None:
    config = StandInConfig()
    assert config.wire == "msgpack"
    assert config.content_type == "application/msgpack"
    assert config.default_groups == OPTIONAL_GROUPS
    assert StandInConfig(wire="json").content_type == "application/json"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("wire", "protobuf"),
        ("dtype", "float64"),
        ("port", 70000),
        ("port", True),
        ("latent_channels", 0),
        ("num_frames", 1.5),
        ("max_concurrent", 0),
        ("latent_height", 7),
        ("step_latency_s", -0.1),
        ("warmup_s", float("nan")),
        ("guidance_scale", float("inf")),
        ("host", ""),
        ("default_groups", frozenset({"sigmas"})),
        ("default_groups", "dit_trajectory"),
        ("null_groups", 1),
    ],
)
def test_bad_value_raises_value_error_naming_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError) as info:
        StandInConfig(**{field: value})  # type: ignore[arg-type]
    assert field in str(info.value)
    assert repr(value) in str(info.value) or field == "default_groups"


def test_config_is_frozen_and_keyword_only() -> None:
    config = StandInConfig(default_groups={"dit_trajectory"})  # type: ignore[arg-type]
    assert config.default_groups == frozenset({"dit_trajectory"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.wire = "json"  # type: ignore[misc]
    with pytest.raises(TypeError):
        StandInConfig("json")  # type: ignore[misc]


def test_fault_update_is_all_or_nothing() -> None:
    faults = Faults()
    with pytest.raises(ValueError, match="stall_s"):
        faults.update({"drop_connection_next": 2, "stall_s": -1})
    assert faults.drop_connection_next == 0
    with pytest.raises(ValueError, match="bogus"):
        faults.update({"bogus": 1})
    with pytest.raises(ValueError, match="status_next"):
        faults.update({"status_next": [99]})
    faults.update({"status_next": [503], "unhealthy": True})
    assert faults.to_json()["status_next"] == [503]
    faults.clear()
    assert faults == Faults()
