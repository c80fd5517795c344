"""Quiet progress bars in a Jupyter kernel that has no ipywidgets.

``tqdm.auto`` warns "IProgress not found" the first time it is imported in such a kernel,
and transformers and huggingface_hub import it as a tokenizer or model loads: the warning
lands under whichever cell loads one first, though every bar there is the text bar anyway.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

__all__ = ["quiet_tqdm_auto"]


def quiet_tqdm_auto() -> None:
    """In a Jupyter kernel without ipywidgets, import ``tqdm.auto`` once with its
    "IProgress not found" warning ignored: later imports (ours, transformers') find it
    imported and say nothing, and its ``tqdm`` is the text bar. Anywhere else it does
    nothing. Call it before anything imports ``tqdm.auto``; once it is, it is too late."""
    if (
        "ipykernel" not in sys.modules
        or "tqdm.autonotebook" in sys.modules
        or importlib.util.find_spec("ipywidgets") is not None
    ):
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import tqdm.auto  # noqa: F401
