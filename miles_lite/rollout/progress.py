"""The rollout's progress bar (tqdm, counted in samples)."""

from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]


def progress_bar(total: int) -> Any:
    """A tqdm bar: the widget in a notebook with ipywidgets, else the text bar (in a
    kernel without ipywidgets, ``tqdm.auto`` is imported quietly: it would warn "IProgress
    not found" and fall back to the text bar anyway). In a terminal the finished bar goes
    (what follows starts on its cleared line); in a notebook, a log or a pipe it stays and
    ends its line, so that what is written next is never glued onto it."""
    import sys

    from miles_lite._core.notebook import quiet_tqdm_auto

    quiet_tqdm_auto()
    from tqdm.auto import tqdm

    terminal = "ipykernel" not in sys.modules and _isatty(sys.stderr)
    return tqdm(total=total, unit="sample", desc="rollout", leave=not terminal)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no such method, or a closed stream
        return False
