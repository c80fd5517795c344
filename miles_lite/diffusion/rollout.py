"""The diffusion rollout: the driver's units are microgroups, generate -> deserialize -> reward.

Every microgroup is a task (see :mod:`miles_lite.rollout.driver`), so decoding and
scoring of the first answers overlap with generation still in flight; nothing waits for
the whole batch. Failures are per microgroup: its samples are marked FAILED with the
typed error, and the rest of the rollout goes on. Unlike miles (whose diffusion path
raises NotImplementedError here), diffusion rollouts oversample and stop early: engines
cannot abort a diffusion request, so in-flight requests are cancelled (the connection is
closed) and pending microgroups are never sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from typing import Any

from miles_lite.diffusion.generate import DiffusionState, generate_diffusion
from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.router import Router
from miles_lite.pools.arena import Arena, ArenaConfig
from miles_lite.pools.parser_pool import ParserPool, ParserPoolConfig
from miles_lite.pools.reward_pool import RewardPoolLike
from miles_lite.rollout.config import DiffusionRolloutConfig
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.rollout import RolloutBase, reward_pools
from miles_lite.rollout.spans import UnitSpan
from miles_lite.types import Sample

__all__ = ["DiffusionRollout"]


class DiffusionRollout(RolloutBase):
    """Runs diffusion rollouts over engines, a parser pool and reward pools.

    Parts are passed in and stay the caller's to close, so they are started once and
    reused across rollouts; :meth:`open` builds and closes them for you.

    - ``generate``: a custom generate function (default :func:`generate_diffusion`);
      ``generate_options``: what it gets as ``input.options``;
    - ``rewards``: reward pools by kind (``config.reward``/``group_reward`` and
      ``metadata["rm_type"]`` name them);
    - ``dynamic_filter``: one filter or a list (``(group) -> bool | FilterResult``);
    - ``progress``: show a tqdm bar of kept samples;
    - ``arena``: where bodies the main process reads land (default: the parser pool's).

    Raises :class:`~miles_lite.errors.ConfigError` when a reward kind has no pool.
    """

    config: DiffusionRolloutConfig

    def __init__(
        self,
        *,
        config: DiffusionRolloutConfig,
        client: EngineClient,
        router: Router,
        parser: ParserPool | None = None,
        rewards: Mapping[str, RewardPoolLike] | None = None,
        generate: GenerateFn | None = None,
        generate_options: Mapping[str, Any] | None = None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None = None,
        progress: bool = False,
        arena: Arena | None = None,
    ) -> None:
        self.config = config
        self.generate = generate or generate_diffusion
        self.generate_options = dict(generate_options or {})
        self.state = DiffusionState(
            config=config,
            client=client,
            router=router,
            parser=parser,
            arena=arena if arena is not None else (parser.arena if parser is not None else None),
        )
        self._init_driver(
            _DiffusionKind(self),
            rewards,
            dynamic_filter,
            progress=progress,
            max_started_samples=2 * router.capacity * config.microgroup_size,
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
        router_config = router_config or RouterConfig(max_inflight_per_engine=4)
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(EngineClient(client_config))
            router = await stack.enter_async_context(Router(engine_urls, client, router_config))
            parser = None
            arena = None
            if config.transport == "pool" or config.fetch_in_parser:
                parser_config = parser_config or ParserPoolConfig()
                if config.fetch_in_parser:
                    # Each generation in flight holds a worker while the engine works.
                    needed = min(254, router.capacity)
                    if parser_config.workers < needed:
                        parser_config = dataclasses.replace(parser_config, workers=needed)
                parser = await stack.enter_async_context(ParserPool(parser_config))
                arena = parser.arena
            elif parser_config is None or parser_config.arena is not None:
                # Inline decoding still reads bodies into reused, pre-faulted memory.
                arena_config = parser_config.arena if parser_config else ArenaConfig()
                arena = await stack.enter_async_context(await Arena.create(arena_config))
            pools = await reward_pools(stack, rewards or {}, workers=reward_workers, arena=arena)
            yield cls(
                config=config,
                client=client,
                router=router,
                parser=parser,
                rewards=pools,
                arena=arena,
                **kwargs,
            )


class _DiffusionKind:
    """What the driver needs of diffusion: microgroups, the generate call, the parser window."""

    drain_on_stop = False  # engines cannot abort a diffusion request: cancel it

    def __init__(self, rollout: DiffusionRollout) -> None:
        self.rollout = rollout

    def units(self, group: list[Sample]) -> list[list[Sample]]:
        config = self.rollout.config
        return [group[start : start + size] for start, size in config.microgroups(len(group))]

    async def generate(self, unit: list[Sample], span: UnitSpan) -> list[Sample]:
        made = await self.rollout.call_generate(unit, span)
        if len(made) == len(unit) and [id(s) for s in made] != [id(s) for s in unit]:
            # A custom function may return new objects: copy them into our slots.
            for slot, new in zip(unit, made, strict=True):
                slot.__dict__.update(
                    {k: v for k, v in new.__dict__.items() if k not in ("index", "group_index")}
                )
            return unit
        return made

    async def abort(self) -> None:
        return None  # the driver cancels in-flight requests; nothing to tell the engines

    @contextmanager
    def measure(self) -> Iterator[Callable[[], dict[str, float]]]:
        parser = self.rollout.state.parser
        with ExitStack() as stack:
            window = stack.enter_context(parser.measure()) if parser is not None else None

            def metrics() -> dict[str, float]:
                if window is not None and window.ran:
                    return {"perf/parser_max_queue_depth": float(window.max_queue_depth)}
                return {}

            yield metrics

    def sample_metrics(self, samples: list[Sample]) -> dict[str, float]:
        return {}
