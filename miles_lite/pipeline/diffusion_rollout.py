"""The diffusion rollout: one task per microgroup, generate -> deserialize -> reward.

Every microgroup is a task in one anyio task group, so decoding and scoring of the first
answers overlap with generation still in flight; nothing waits for the whole batch. A
group's ``group_reward`` and the dynamic filter run once its last microgroup lands.
Failures are per microgroup: its samples are marked FAILED with the typed error, and the
rest of the rollout goes on.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from miles_lite.config import DiffusionRolloutConfig
from miles_lite.engine import EngineClient, EngineClientConfig, Router, RouterConfig
from miles_lite.errors import GenerateError, MilesLiteError, RewardError
from miles_lite.generate.contract import GenerateFn, GenerateFnInput
from miles_lite.generate.diffusion import DiffusionState, generate_diffusion
from miles_lite.pipeline.spans import MicrogroupSpan, span_metrics
from miles_lite.pools.arena import Arena, ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import ApiRewardPool, RewardPool, RewardPoolLike
from miles_lite.types import Sample, SampleStatus

__all__ = ["DiffusionRollout", "GroupFilter", "PromptGroup", "RolloutResult"]

#: ``filter(group) -> keep?``, called once per group after its rewards.
GroupFilter = Callable[[list[Sample]], bool]


@dataclass
class PromptGroup:
    """A prompt and, optionally, its own seed list (one per sample), label and metadata."""

    prompt: str
    seeds: list[int] | None = None
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutResult:
    """What a rollout returns.

    ``groups``: the kept groups in prompt order, samples sorted by index (failed samples
    included, marked FAILED with their error); ``filtered``: groups the dynamic filter
    dropped; ``metrics``: flat floats (``perf/rollout_time``, queue depths, stage means);
    ``spans``: per-microgroup stage times.
    """

    groups: list[list[Sample]]
    filtered: list[list[Sample]]
    metrics: dict[str, float]
    spans: list[MicrogroupSpan]

    @property
    def samples(self) -> list[Sample]:
        """Every sample of the kept groups, sorted by index."""
        return sorted((s for g in self.groups for s in g), key=lambda s: s.index)

    @property
    def failed(self) -> list[Sample]:
        """The samples that failed, with ``sample.error`` saying why."""
        return [s for s in self.samples if s.status is SampleStatus.FAILED]


class DiffusionRollout:
    """Runs diffusion rollouts over engines, a parser pool and reward pools.

    Parts are passed in and stay the caller's to close, so they are started once and
    reused across rollouts; :meth:`open` builds and closes them for you.

    - ``generate``: a custom generate function (default :func:`generate_diffusion`);
    - ``rewards``: reward pools by kind (``config.reward``/``group_reward`` and
      ``metadata["rm_type"]`` name them);
    - ``dynamic_filter``: ``(group) -> keep?``;
    - ``progress``: show a tqdm bar of finished samples;
    - ``arena``: where bodies the main process reads land (default: the parser pool's).
    """

    def __init__(
        self,
        *,
        config: DiffusionRolloutConfig,
        client: EngineClient,
        router: Router,
        parser: ParserPool | None = None,
        rewards: Mapping[str, RewardPoolLike] | None = None,
        generate: GenerateFn | None = None,
        dynamic_filter: GroupFilter | None = None,
        progress: bool = False,
        arena: Arena | None = None,
    ) -> None:
        self.config = config
        self.rewards = dict(rewards or {})
        for kind in (config.reward, config.group_reward):
            if kind is not None and kind not in self.rewards:
                raise MilesLiteError(
                    f"reward kind {kind!r} has no pool; have {sorted(self.rewards)}"
                )
        self.generate = generate or generate_diffusion
        self.dynamic_filter = dynamic_filter
        self.progress = progress
        self.state = DiffusionState(
            config=config,
            client=client,
            router=router,
            parser=parser,
            rand=random.Random(),
            arena=arena if arena is not None else (parser.arena if parser is not None else None),
        )

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        engine_urls: Sequence[str],
        *,
        config: DiffusionRolloutConfig | None = None,
        client_config: EngineClientConfig | None = None,
        router_config: RouterConfig | None = None,
        parser_config: ParserPoolConfig | None = None,
        rewards: Mapping[str, Any] | None = None,
        reward_workers: int = 1,
        **kwargs: Any,
    ) -> AsyncIterator[DiffusionRollout]:
        """Build every part, yield a rollout, close every part on exit.

        With ``fetch_in_parser`` the parser pool gets at least ``len(engine_urls) *
        max_inflight_per_engine`` workers: a worker is busy for the whole generation of the
        request it fetches (parser workers do not import torch: each costs ~20 MB).

        ``rewards`` maps a kind to a reward function (run in a :class:`RewardPool` of
        ``reward_workers`` processes), an async scorer with ``score`` (an
        :class:`ApiRewardPool`), or a ready pool. Other keywords go to the constructor.
        """
        config = config or DiffusionRolloutConfig()
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(EngineClient(client_config))
            router = await stack.enter_async_context(Router(engine_urls, client, router_config))
            parser = None
            arena = None
            if config.transport == "pool" or config.fetch_in_parser:
                parser_config = parser_config or ParserPoolConfig()
                if config.fetch_in_parser:
                    # Each generation in flight holds a worker while the engine works.
                    needed = min(254, len(engine_urls) * config.max_inflight_per_engine)
                    if parser_config.workers < needed:
                        parser_config = dataclasses.replace(parser_config, workers=needed)
                parser = await stack.enter_async_context(ParserPool(parser_config))
                arena = parser.arena
            elif parser_config is None or parser_config.arena is not None:
                # Inline decoding still reads bodies into reused, pre-faulted memory.
                arena_config = parser_config.arena if parser_config else ArenaConfig()
                arena = await stack.enter_async_context(await Arena.create(arena_config))
            pools: dict[str, RewardPoolLike] = {}
            for kind, spec in (rewards or {}).items():
                if hasattr(spec, "measure") and hasattr(spec, "score"):
                    pools[kind] = spec
                elif hasattr(spec, "score"):
                    pools[kind] = ApiRewardPool(kind, spec)
                else:
                    pools[kind] = await stack.enter_async_context(
                        RewardPool(kind, spec, workers=reward_workers, arena=arena)
                    )
            yield cls(
                config=config,
                client=client,
                router=router,
                parser=parser,
                rewards=pools,
                arena=arena,
                **kwargs,
            )

    def make_groups(self, prompts: Sequence[str | PromptGroup]) -> list[list[Sample]]:
        """The samples of each prompt, with indices and seeds (see DiffusionRolloutConfig)."""
        n = self.config.n_samples_per_prompt
        groups = []
        for g, spec in enumerate(prompts):
            group = spec if isinstance(spec, PromptGroup) else PromptGroup(prompt=spec)
            seeds = group.seeds or [self.config.seed + g * n + j for j in range(n)]
            if len(seeds) != n:
                raise MilesLiteError(
                    f"prompt {g} has {len(seeds)} seeds for {n} samples per prompt"
                )
            groups.append(
                [
                    Sample(
                        index=g * n + j,
                        group_index=g,
                        prompt=group.prompt,
                        label=group.label,
                        seed=seeds[j],
                        metadata=dict(group.metadata),
                    )
                    for j in range(n)
                ]
            )
        return groups

    async def run(self, prompts: Sequence[str | PromptGroup]) -> RolloutResult:
        """Run one rollout over ``prompts`` and return every group, scored.

        Per-microgroup failures do not raise: their samples come back FAILED with the
        typed error. Cancellation stops every task; answers still arriving free their
        memory.
        """
        started = time.monotonic()
        groups = self.make_groups(prompts)
        spans: list[MicrogroupSpan] = []
        kept: list[tuple[int, list[Sample]]] = []
        filtered: list[tuple[int, list[Sample]]] = []
        engines = len(self.state.router.urls)
        limiter = anyio.CapacityLimiter(self.config.max_inflight_per_engine * engines)
        bar = _progress_bar(sum(len(g) for g in groups)) if self.progress else None
        with ExitStack() as stack:
            parser_window = (
                stack.enter_context(self.state.parser.measure()) if self.state.parser else None
            )
            reward_windows = {k: stack.enter_context(p.measure()) for k, p in self.rewards.items()}

            async def run_group(index: int, group: list[Sample]) -> None:
                async with anyio.create_task_group() as tg:
                    for m, (start, size) in enumerate(self.config.microgroups(len(group))):
                        span = MicrogroupSpan(group_index=index, microgroup_index=m, size=size)
                        spans.append(span)
                        tg.start_soon(
                            self._run_microgroup, group[start : start + size], span, limiter, bar
                        )
                await self._finish_group(group)
                keep = self.dynamic_filter is None or self.dynamic_filter(group)
                (kept if keep else filtered).append((index, group))

            try:
                async with anyio.create_task_group() as tg:
                    for index, group in enumerate(groups):
                        tg.start_soon(run_group, index, group)
            finally:
                if bar is not None:
                    bar.close()
            elapsed = time.monotonic() - started
            metrics = self._metrics(elapsed, groups, filtered, spans, parser_window, reward_windows)
        kept.sort(key=lambda item: item[0])
        filtered.sort(key=lambda item: item[0])
        spans.sort(key=lambda s: (s.group_index, s.microgroup_index))
        return RolloutResult(
            groups=[sorted(g, key=lambda s: s.index) for _, g in kept],
            filtered=[g for _, g in filtered],
            metrics=metrics,
            spans=spans,
        )

    async def _run_microgroup(
        self, samples: list[Sample], span: MicrogroupSpan, limiter: anyio.CapacityLimiter, bar: Any
    ) -> None:
        fn_input = GenerateFnInput(
            samples=samples, sampling_params=self.config.sampling.to_payload(), state=self.state
        )
        try:
            async with limiter:
                out = await self.generate(fn_input)
            if isinstance(out, Sample):
                out = [out]
            if [id(s) for s in out] != [id(s) for s in samples]:
                # A custom function may return new objects: copy them into our slots.
                for slot, made in zip(samples, out, strict=True):
                    slot.__dict__.update(
                        {
                            k: v
                            for k, v in made.__dict__.items()
                            if k not in ("index", "group_index")
                        }
                    )
        except MilesLiteError as exc:
            self._fail(samples, span, exc)
        except Exception as exc:
            self._fail(
                samples,
                span,
                GenerateError(f"generate function raised {type(exc).__name__}: {exc}"),
            )
        finally:
            _record(span, fn_input.spans)
        if span.error is None:
            span.reward_start = time.monotonic()
            await self._score(samples, span)
            span.reward_end = time.monotonic()
        if bar is not None:
            bar.update(len(samples))

    async def _score(self, samples: list[Sample], span: MicrogroupSpan) -> None:
        by_kind: dict[str, list[Sample]] = {}
        for sample in samples:
            kind = sample.metadata.get("rm_type", self.config.reward)
            if kind is not None:
                by_kind.setdefault(kind, []).append(sample)

        async def score(kind: str, batch: list[Sample]) -> None:
            pool = self.rewards.get(kind)
            try:
                if pool is None:
                    raise RewardError(
                        f"no reward pool for kind {kind!r}; have {sorted(self.rewards)}"
                    )
                scores = await pool.score(batch)
            except MilesLiteError as exc:
                error = RewardError(str(exc), url=span.engine, request_id=batch[0].request_id)
                error.__cause__ = exc
                self._fail(batch, span, error)
                return
            for sample, value in zip(batch, scores, strict=True):
                sample.reward = value

        async with anyio.create_task_group() as tg:
            for kind, batch in by_kind.items():
                tg.start_soon(score, kind, batch)

    async def _finish_group(self, group: list[Sample]) -> None:
        kind = self.config.group_reward
        alive = [s for s in group if s.status is not SampleStatus.FAILED]
        if kind is None or not alive:
            return
        try:
            scores = await self.rewards[kind].score(alive)
        except MilesLiteError as exc:
            for sample in alive:
                sample.fail(exc)
            return
        for sample, value in zip(alive, scores, strict=True):
            sample.reward = value

    @staticmethod
    def _fail(samples: list[Sample], span: MicrogroupSpan, error: MilesLiteError) -> None:
        for sample in samples:
            sample.fail(error)
        span.error = str(error)

    def _metrics(
        self,
        elapsed: float,
        groups: list[list[Sample]],
        filtered: list[tuple[int, list[Sample]]],
        spans: list[MicrogroupSpan],
        parser_window: Any,
        reward_windows: dict[str, Any],
    ) -> dict[str, float]:
        samples = [s for g in groups for s in g]
        metrics: dict[str, float] = {
            "perf/rollout_time": elapsed,
            "rollout/samples": float(len(samples)),
            "rollout/failed_samples": float(sum(s.status is SampleStatus.FAILED for s in samples)),
            "rollout/filtered_groups": float(len(filtered)),
        }
        if parser_window is not None and parser_window.ran:
            metrics["perf/parser_max_queue_depth"] = float(parser_window.max_queue_depth)
        for kind, window in reward_windows.items():
            if window.ran:
                metrics[f"perf/reward_max_queue_depth_{kind}"] = float(window.max_queue_depth)
        metrics.update(span_metrics(spans))
        return metrics


def _record(span: MicrogroupSpan, times: dict[str, Any]) -> None:
    for key in ("generate_start", "generate_end", "deserialize_start", "deserialize_end"):
        if key in times:
            setattr(span, key, times[key])
    span.engine = times.get("engine")
    span.wire_bytes = int(times.get("wire_bytes", 0))
    span.spilled = bool(times.get("spilled", False))


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sample", desc="rollout", leave=False)
