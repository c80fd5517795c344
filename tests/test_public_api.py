"""The public surface is small and deliberate, and the packages depend on each other one
way: a test fails when a name leaks to the top level, a package imports one above it, or
the library imports its own stand-ins."""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path

import pytest

import miles_lite
import miles_lite.errors

PACKAGE = Path(miles_lite.__file__).parent

PACKAGES = [
    "miles_lite",
    "miles_lite.agentic",
    "miles_lite.codecs",
    "miles_lite.diffusion",
    "miles_lite.engine",
    "miles_lite.errors",
    "miles_lite.pools",
    "miles_lite.rewards",
    "miles_lite.rollout",
    "miles_lite.sglang",
    "miles_lite.testing",
    "miles_lite.text",
    "miles_lite.training",
]

#: Each package's layer: it may import only from layers below its own. (``testing`` may
#: use anything; ``cli`` everything but the stand-ins, which only its demo commands start.)
LAYERS = {
    "errors": 0,
    "types": 1,
    "_core": 1,
    "sglang": 2,
    "engine": 3,
    "codecs": 3,
    "pools": 4,
    "rewards": 5,
    "rollout": 5,
    "training": 5.5,  # the trainer's side (the Rollout facade, stream, journal) over the core
    "text": 6,
    "diffusion": 6,
    "agentic": 7,
    "cli": 8,
    "testing": 9,
}

TOP_LEVEL = {
    "AgentGenerate",
    "CodecError",
    "ConfigError",
    "DiffusionRollout",
    "DiffusionRolloutConfig",
    "DiffusionSamplingParams",
    "EngineConfig",
    "EngineError",
    "FilterResult",
    "GenerateError",
    "MilesLiteError",
    "PromptGroup",
    "RewardError",
    "RolloutResult",
    "Sample",
    "SampleStatus",
    "TextRollout",
    "TextRolloutConfig",
    "TextSamplingParams",
    "WorkerError",
    "drop_aborted",
    "drop_failed",
    "drop_zero_std",
    "run_sync",
}


def isort_key(name: str) -> tuple[int, str]:
    # Constants, then classes, then functions: ruff's RUF022 (isort-style) order.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_the_top_level_is_the_rollouts_their_configs_and_the_error_families() -> None:
    assert set(miles_lite.__all__) == TOP_LEVEL
    assert len(miles_lite.__all__) <= 25
    # The whole error tree stays in miles_lite.errors; the families are at the top.
    assert len(miles_lite.errors.__all__) > 20


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_complete_and_documented(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(set(exported), key=isort_key)
    for attr in exported:
        obj = getattr(module, attr)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name}.{attr} has no docstring"
    public = {
        attr
        for attr, obj in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(obj, types.ModuleType)
        and attr not in ("annotations", "RETRYABLE_STATUSES")
    }
    assert public == set(exported) | (public & {"tiny_clip"})


def test_rollout_is_the_driver_core_and_training_the_trainers_side() -> None:
    # Issue 34.3: the facade a trainer holds, its stream, the staleness gate and training
    # batches left rollout/; rollout exports only its own modules' names.
    import miles_lite.rollout
    import miles_lite.training

    assert all(module.startswith("miles_lite.rollout.") for module in miles_lite.rollout._EXPORTS)
    trainer = {"Rollout", "GroupStream", "StreamStatistics", "TrainingBatch", "training_batch"}
    assert trainer <= set(miles_lite.training.__all__)
    assert not set(miles_lite.rollout.__all__) & set(miles_lite.training.__all__)
    moved = ("rollout.py", "stream.py", "staleness.py", "batch.py", "weights.py", "recording.py")
    assert not [name for name in moved if (PACKAGE / "rollout" / name).exists()]


def test_every_error_says_what_it_is_raised_for() -> None:
    for name in miles_lite.errors.__all__:
        obj = getattr(miles_lite.errors, name)
        if issubclass(obj, Warning):  # our warnings live beside the errors, not under them
            assert obj.__doc__ and obj.__doc__.startswith("Warned when"), name
            continue
        assert obj.__doc__ and obj.__doc__.startswith("Raised when"), name
        assert issubclass(obj, miles_lite.MilesLiteError)


def test_the_package_ships_its_types() -> None:
    from importlib.resources import files

    assert files("miles_lite").joinpath("py.typed").is_file()


def _imports() -> list[tuple[str, str, bool, Path]]:
    """(importing package, imported package, at module level, file) of every import of a
    miles_lite module inside the package."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue  # the top level re-exports from everywhere
        importer = parts[0]
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("miles_lite.") or name == "miles_lite":
                    imported = name.split(".")[1] if "." in name else "miles_lite"
                    found.append((importer, imported, id(node) in top_level, path))
    return found


def test_packages_depend_on_each_other_one_way() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE)}: {importer} imports {imported}"
        for importer, imported, _, path in _imports()
        if importer != imported
        and importer != "testing"
        and (imported == "miles_lite" or LAYERS[imported] >= LAYERS[importer])
        and not (importer == "cli" and imported == "testing")
    ]
    assert wrong == []


def test_the_library_never_imports_its_stand_ins() -> None:
    # A leaf: only the CLI's demo commands start stand-ins, importing them when run.
    users = [
        (importer, path.name, at_top)
        for importer, imported, at_top, path in _imports()
        if imported == "testing" and importer != "testing"
    ]
    assert all(importer == "cli" and not at_top for importer, _, at_top in users), users
