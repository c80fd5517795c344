"""What a command checks before it does anything slow: the engine URLs (scheme, host,
port), and that every file it will write can be written, so a mistake costs no
tokenizer load, no engine wait and no lost run. Each check raises
:class:`~miles_lite.cli.paths.CliError` naming the flag, its value and what is wrong.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from miles_lite.cli.paths import CliError
from miles_lite.engine.balancer import check_engine_url
from miles_lite.errors import ConfigError

__all__ = ["check_engine_urls", "check_outputs", "check_writable"]


def check_engine_urls(urls: Sequence[str]) -> None:
    """Each ``--engine-url`` is ``http(s)://host[:port]`` with a host and port that parse
    (``http://::zz`` does not: an IPv6 host needs brackets), by the library's own check."""
    try:
        for url in urls:
            check_engine_url(url)
    except ConfigError as exc:
        raise CliError(f"--engine-url: {exc}") from exc


def check_writable(flag: str, path: str) -> None:
    """``path`` can be written: not a folder, its folder exists and is writable, and an
    existing file there is writable. Nothing is created."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise CliError(f"{flag} {path}: is a folder; give a file path")
    folder = target.parent
    if not folder.is_dir():
        raise CliError(f"{flag} {path}: cannot write there: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: cannot write there: the folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise CliError(f"{flag} {path}: cannot write there: the file is not writable")


def check_outputs(*, output: str | None, trace: str | None, timeline: str | None) -> None:
    """``--output`` (``-``: stdout), ``--trace`` and ``--timeline`` can be written, and
    ``--timeline``'s picture can be drawn (matplotlib is installed), before the run: a
    run whose results cannot be written is lost."""
    for flag, path in (("--output", output), ("--trace", trace), ("--timeline", timeline)):
        if path is not None and not (flag == "--output" and path == "-"):
            check_writable(flag, path)
    if timeline is not None and importlib.util.find_spec("matplotlib") is None:
        raise CliError(
            f"--timeline {timeline}: drawing it needs matplotlib; pip install matplotlib,"
            " or leave out --timeline"
        )
