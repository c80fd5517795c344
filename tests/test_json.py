"""miles_lite._core.json: msgspec speed, the standard library's behaviour where it differs."""

from __future__ import annotations

import json
import math

import pytest

from miles_lite._core import json as _json


def test_dumps_is_compact_json_and_refuses_nan_unless_told() -> None:
    obj = {"ids": [1, 2, 3], "t": 0.5, "stop": None, "name": "é"}
    assert json.loads(_json.dumps(obj)) == obj
    assert b" " not in _json.dumps(obj)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="JSON compliant"):
            _json.dumps({"lp": [0.0, bad]})
        assert json.loads(_json.dumps({"lp": [bad]}, strict=False)) == {"lp": [None]}
    with pytest.raises(TypeError):
        _json.dumps({"x": object()})


def test_loads_reads_python_json_nan_and_names_what_is_not_json() -> None:
    assert _json.loads(memoryview(b'{"a": [1, 2.5, null]}')) == {"a": [1, 2.5, None]}
    value = _json.loads(b'{"lp": NaN, "hi": Infinity}')
    assert math.isnan(value["lp"]) and value["hi"] == math.inf
    for garbage in (b"{", b"Cache flushed.", b"\xff\xfe"):
        with pytest.raises(ValueError):
            _json.loads(garbage)
