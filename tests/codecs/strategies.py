"""Hypothesis strategies: msgpack-able values and per-sample tensor trees."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

#: Every dtype the encoders and decoders know (the float8 ones take the reference encoder).
DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)

INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1

scalars = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, UINT64_MAX)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)

#: Arbitrary msgpack values: scalars, bytes, lists and str-keyed maps, nested.
msgpack_values = st.recursive(
    scalars | st.binary(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=40,
)

#: Dims of 1..4, and now and then a zero-size one.
shapes = st.lists(st.sampled_from([1, 2, 3, 4, 0, 2, 3]), min_size=0, max_size=5)


@st.composite
def tensors(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = DTYPES) -> torch.Tensor:
    """A tensor of random bytes: any dtype, 0-d to 5-d, zero-size dims included."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes)
    seed = draw(st.integers(0, 2**32 - 1))
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = np.random.default_rng(seed).integers(0, 256, size=numel * itemsize, dtype=np.uint8)
    if dtype == torch.bool:
        raw %= 2  # a bool byte other than 0/1 is not a valid torch.bool
    flat = torch.from_numpy(raw).view(dtype) if numel else torch.empty(0, dtype=dtype)
    t = flat.reshape(shape)
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # the encoders must cope with non-contiguous tensors
    return t


_keys = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


def _leaves(with_bytes: bool) -> st.SearchStrategy[Any]:
    plain = (
        st.none()
        | st.booleans()
        | st.integers(INT64_MIN, 2**63 - 1)
        | st.floats(allow_nan=False)
        | st.text(max_size=10)
    )
    if with_bytes:
        plain = plain | st.binary(max_size=10)
    return tensors() | tensors() | plain


def sample_trees(*, with_bytes: bool) -> st.SearchStrategy[list[dict[str, Any]]]:
    """A rollout answer: a list of sample maps holding tensors, groups, lists and Nones.

    ``with_bytes`` adds raw ``bytes`` values, which only the msgpack form can carry.
    """
    groups = st.recursive(
        _leaves(with_bytes),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
        max_leaves=8,
    )
    return st.lists(st.dictionaries(_keys, groups, max_size=5), max_size=3)
