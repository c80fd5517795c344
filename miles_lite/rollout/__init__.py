"""The driver core every kind shares: the driver and its per-run context, the
generate-function contract, groups, seeds, filters, rewards (scoring, the pools an
``open()`` starts), results, spans and traces, and the config every rollout extends.

What a trainer holds (the :class:`~miles_lite.training.Rollout` facade with ``run``,
``stream``, ``commit`` and ``update_weights``; streamed groups; the staleness gate;
training batches; the journal) is one floor up, in :mod:`miles_lite.training`.
"""

from miles_lite._core.lazy import lazy_exports as _lazy_exports

# Imported when first used, as every package's names are (see miles_lite._core.lazy).
_EXPORTS: dict[str, list[str]] = {
    "miles_lite.rollout.config": ["RolloutConfig", "StalenessPolicy"],
    "miles_lite.rollout.context": ["InFlight", "RunContext"],
    "miles_lite.rollout.contract": ["AbortResult", "BindsContext", "GenerateFn", "GenerateFnInput"],
    "miles_lite.rollout.driver": ["Driver"],
    "miles_lite.rollout.filters": [
        "FilterResult",
        "GroupFilter",
        "drop_aborted",
        "drop_failed",
        "drop_zero_std",
    ],
    "miles_lite.rollout.groups": ["PromptGroup"],
    "miles_lite.rollout.hooks": ["RunHandle", "RunHooks"],
    "miles_lite.rollout.kind": ["RolloutKind"],
    "miles_lite.rollout.result": ["RolloutResult"],
    "miles_lite.rollout.seeds": ["group_seeds"],
    "miles_lite.rollout.spans": ["UnitSpan"],
}
__getattr__, __dir__, __all__ = _lazy_exports(__name__, _EXPORTS)
