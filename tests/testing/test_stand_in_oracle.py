"""The stand-ins are an oracle for the library: their own lists, none of its code.

- The sampling keys the text stand-in accepts are SGLang 0.5.23's, as the real server
  lists them in its 400 (``tests/data/sglang_captures/gen_bad_sampling_key.txt``).
- ``miles_lite/testing`` imports nothing from the library but ``serve_app``,
  ``miles_lite._core.json`` and the lifecycle base (``AsyncResource``): no error
  classes of the wire, no sampling lists, no codecs. The one exception is not a
  stand-in: the launcher of the real ``smg`` router starts it with the flags the library's
  smg front uses (one source for them), so it may read ``miles_lite.engine.smg``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import miles_lite.testing
from miles_lite.testing import SAMPLING_KEYS

PACKAGE = Path(miles_lite.testing.__file__).resolve().parent
#: What the stand-ins may import from the library outside their own package: serving,
#: JSON, and the one lifecycle (new -> open -> closed) every resource owner shares.
ALLOWED = {"miles_lite._core.serve", "miles_lite._core.json", "miles_lite._core.resources"}


def test_sampling_keys_are_those_the_real_server_lists(captures: Path) -> None:
    # The capture is the answer body, then its status on a line of its own.
    body, status = (captures / "gen_bad_sampling_key.txt").read_text().rsplit("\n", 1)
    assert status.strip() == "[400]"
    message = json.loads(body)["error"]
    assert message.startswith("unknown field `bogus_key`, expected one of ")
    listed = tuple(re.findall(r"`([a-z_]+)`", message.split("expected one of", 1)[1]))
    assert listed == SAMPLING_KEYS  # the same keys, in SGLang's order


def library_imports(path: Path) -> list[str]:
    """The ``miles_lite`` modules ``path`` imports, wherever in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)  # (a relative import stays inside the package)
    return [name for name in found if name.split(".")[0] == "miles_lite"]


def test_the_stand_ins_import_nothing_of_the_library() -> None:
    offending = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name in library_imports(path)
        if not (name == "miles_lite.testing" or name.startswith("miles_lite.testing."))
        and name not in ALLOWED
        and not (path.name == "smg_router.py" and name == "miles_lite.engine.smg")
    }
    assert not offending, sorted(offending)
