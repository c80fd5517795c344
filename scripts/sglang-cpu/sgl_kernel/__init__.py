"""A pure-torch stand-in for the one sgl_kernel function SGLang's CPU engine calls.

sgl-kernel's CPU build is not on the package registry and its CUDA build needs libcuda.
On a CPU without AMX, SGLang 0.5.23's CPU engine calls only
``assign_req_to_token_pool_cpu``; every other name raises NotImplementedError so a new
call site fails loudly instead of computing something wrong.
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "0.0.0+miles-lite-cpu-shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    row_stride: int,
) -> None:
    """Write each request's new cache slots into its row of the request-to-token table.

    SGLang passes ``req_to_token.shape[1]`` (the row stride) last, not the batch size: the
    batch is ``len(req_pool_indices)``. The slots of all requests lie contiguously in
    ``out_cache_loc``, in batch order.
    """
    del row_stride  # a torch view already knows its stride
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    pos = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        n = int(end) - int(start)
        req_to_token[int(row), int(start) : int(end)] = out_cache_loc[pos : pos + n]
        pos += n


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel CPU shim: {name} is not implemented")

    return _missing
