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
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from miles_lite.diffusion.config import DiffusionRolloutConfig, TransportMode
from miles_lite.diffusion.context import DiffusionContext
from miles_lite.diffusion.generate import generate_diffusion
from miles_lite.diffusion.kind import DiffusionKind
from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.pools.arena import Arena, ArenaConfig
from miles_lite.pools.arena_pages import FIRST_WORKER_TAG, LAST_WORKER_TAG
from miles_lite.pools.parser_pool import ParserPool
from miles_lite.pools.reward_base import RewardPoolLike
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.reward_pools import open_reward_pools
from miles_lite.rollout.startup import startup_step
from miles_lite.training.rollout import Rollout

if TYPE_CHECKING:
    from miles_lite.training.journal import Journal
    from miles_lite.training.recorder import RolloutJournal

__all__ = ["DiffusionRollout"]

#: The most parser workers a pool holds: one arena page tag each.
_MAX_PARSER_WORKERS = LAST_WORKER_TAG - FIRST_WORKER_TAG + 1


class DiffusionRollout(Rollout):
    """Runs diffusion rollouts over engines, a parser pool and reward pools.

    Parts are passed in and stay the caller's to close, so they are started once and
    reused across rollouts; :meth:`open` builds and closes them for you.

    - ``router``: the engines (its client posts);
    - ``parser``: decodes bodies off the loop (needed for ``transport="pool"`` and
      ``fetch_in_parser``); ``arena``: where bodies the main process reads land
      (default: the parser pool's);
    - ``generate``: a custom generate function (default :func:`generate_diffusion`);
      ``generate_options``: what a function loaded by the CLI gets as ``input.options``;
    - ``rewards``: reward pools by kind (``config.reward``/``group_reward`` and
      ``metadata["rm_type"]`` name them);
    - ``dynamic_filter``: one filter or a list (``(group) -> bool | FilterResult``);
    - ``progress``: show a progress bar of kept samples.

    Raises :class:`~miles_lite.errors.ConfigError` when a reward kind has no pool, or the
    transport needs a parser pool and none is given.
    """

    config: DiffusionRolloutConfig
    chat_prompts = False  # a diffusion prompt is text

    def __init__(
        self,
        *,
        config: DiffusionRolloutConfig,
        router: Router,
        parser: ParserPool | None = None,
        arena: Arena | None = None,
        rewards: Mapping[str, RewardPoolLike] | None = None,
        generate: GenerateFn | None = None,
        generate_options: Mapping[str, Any] | None = None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None = None,
        progress: bool = False,
        journal: RolloutJournal | None = None,
    ) -> None:
        self.context = DiffusionContext(
            router=router,
            mode=config.mode,
            parser=parser,
            arena=arena if arena is not None else (parser.arena if parser is not None else None),
        )
        self.generate = generate or generate_diffusion
        super().__init__(
            config=config,
            router=router,
            kind=DiffusionKind(config, self.context, self.generate, dict(generate_options or {})),
            rewards=rewards,
            dynamic_filter=dynamic_filter,
            progress=progress,
            journal=journal,
            max_started_samples=2 * router.capacity * config.microgroup_size,
        )

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        engine_urls: Sequence[str],
        *,
        config: DiffusionRolloutConfig | None = None,
        rewards: Mapping[str, Any] | None = None,
        journal: str | os.PathLike[str] | Journal | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[DiffusionRollout]:
        """Build every part from ``config`` (engines, parser pool and arena, reward
        pools), yield a rollout, close every part on exit.

        With ``fetch_in_parser`` the parser pool gets at least a worker per request the
        engines take at once (``engines.router.max_inflight_per_engine`` x engines, at
        most 254): a worker is busy for the whole generation of the request it fetches
        (parser workers do not import torch: each costs ~20 MB).

        ``rewards`` maps a kind to a reward function (run in a pool of
        ``config.reward_workers`` processes), an async scorer with ``score``, or a ready
        pool. ``journal``: a path or a :class:`~miles_lite.training.Journal`: what the rollout
        makes is journaled there, so a crashed run resumes (``resume()``, ``commit()``;
        see :mod:`miles_lite.training`); a file of another run raises ``JournalError``.
        Other keywords go to the constructor. Each step is logged
        (:mod:`miles_lite.rollout.startup`).

        Raises ``ConfigError`` for an engine URL without ``http://``,
        ``EngineUnavailableError`` naming the URLs when no engine answers ``/health``
        within ``config.engines.router.ready_timeout_s`` (5 s by default; engines still
        loading weights need more), and ``RewardError`` when a reward cannot load.
        """
        config = config or DiffusionRolloutConfig()
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(EngineClient(config.engines.client))
            router = await stack.enter_async_context(
                Router(engine_urls, client, config.engines.router)
            )
            with startup_step(f"waiting for {len(router.urls)} engine(s) to answer /health"):
                await router.wait_ready()
            parser = None
            arena = None
            parser_config = config.parser
            if config.mode is not TransportMode.INLINE:
                if config.mode is TransportMode.FETCH:
                    # Each generation in flight holds a worker while the engine works.
                    needed = min(_MAX_PARSER_WORKERS, router.capacity)
                    if parser_config.workers < needed:
                        parser_config = dataclasses.replace(parser_config, workers=needed)
                with startup_step(
                    f"starting the parser pool ({parser_config.workers} worker(s) and its arena)"
                ):
                    parser = await stack.enter_async_context(ParserPool(parser_config))
                arena = parser.arena
            elif parser_config.arena is not None:
                # Inline decoding still reads bodies into reused, pre-faulted memory.
                arena_config: ArenaConfig = parser_config.arena
                arena = await stack.enter_async_context(Arena(arena_config))
            pools = await open_reward_pools(stack, rewards or {}, config, arena=arena)
            if journal is not None:  # a path is opened here and closed on exit
                from miles_lite.training.recorder import open_journal

                kwargs["journal"] = await stack.enter_async_context(
                    open_journal(journal, kind="diffusion", config=config)
                )
            yield cls(
                config=config, router=router, parser=parser, rewards=pools, arena=arena, **kwargs
            )
