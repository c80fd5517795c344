"""The text rollout: the driver's units are single samples over SGLang ``/generate`` or chat.

Each sample is one unit (a task): its generate function sends one or more requests
(single turn, multi-turn tool calls, an agent's chat turns through a session server),
each with its own rid, then the sample is scored at once in a reward pool. Groups are
``n_samples_per_prompt`` single requests (SGLang replaces rids for ``n > 1``, so a group
cannot be aborted as one request).

Early stop (oversampling satisfied): the run's stop signal keeps generate functions from
sending anything new (a request waiting for an engine slot included); every request of
the run in flight is aborted at its engine (``/abort_request``, bounded, then
``/v1/loads`` polled until idle); the generate function's ``abort`` hook (an agent's) is
called once. Samples come back ABORTED with their partial output in ``result.partial``,
ready to resume in the next ``run()``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from miles_lite.engine.http.client import EngineClient
from miles_lite.engine.router import Router
from miles_lite.pools.reward_base import RewardPoolLike
from miles_lite.rollout.contract import BindsContext, GenerateFn
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.reward_pools import open_reward_pools
from miles_lite.rollout.startup import startup_step
from miles_lite.text.config import TextRolloutConfig
from miles_lite.text.context import TextContext
from miles_lite.text.kind import TextKind
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.training.rollout import Rollout

if TYPE_CHECKING:
    from miles_lite.training.journal import Journal
    from miles_lite.training.recorder import RolloutJournal

__all__ = ["TextRollout"]


class TextRollout(Rollout):
    """Runs text rollouts over SGLang engines (``/generate``, or chat through sessions).

    Parts are passed in and stay the caller's to close; :meth:`open` builds and closes
    them for you. ``generate`` is a generate function (default: single turn; see
    :mod:`miles_lite.text` for multi-turn and benchmark ones, and
    :class:`~miles_lite.AgentGenerate` for agents); ``generate_options`` what a custom
    function loaded by the CLI gets as ``input.options``; ``rewards`` reward pools by
    kind; ``dynamic_filter`` one filter or a list; ``progress`` a progress bar in samples.
    """

    config: TextRolloutConfig

    def __init__(
        self,
        *,
        config: TextRolloutConfig,
        router: Router,
        tokenizer: Any,
        processor: Any = None,
        vocab_size: int | None = None,
        rewards: Mapping[str, RewardPoolLike] | None = None,
        generate: GenerateFn | None = None,
        generate_options: Mapping[str, Any] | None = None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None = None,
        progress: bool = False,
        journal: RolloutJournal | None = None,
    ) -> None:
        self.context = TextContext(
            tokenizer=tokenizer,
            router=router,
            sampling=config.sampling,
            max_context_len=config.max_context_len,
            processor=processor,
            vocab_size=vocab_size,
            tokenize_threads=config.tokenize_threads,
        )
        self.generate = generate or single_turn
        super().__init__(
            config=config,
            router=router,
            kind=TextKind(config, self.context, self.generate, dict(generate_options or {})),
            rewards=rewards,
            dynamic_filter=dynamic_filter,
            progress=progress,
            journal=journal,
            max_started_samples=2 * router.capacity,
        )

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        engine_urls: Sequence[str],
        *,
        tokenizer: Any,
        config: TextRolloutConfig | None = None,
        rewards: Mapping[str, Any] | None = None,
        generate: GenerateFn | None = None,
        journal: str | os.PathLike[str] | Journal | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[TextRollout]:
        """Build the engine client and router (``config.engines``), the reward pools, and
        the generate function's own resources (its ``bind``: an agent's session server);
        yield a rollout; close them all on exit. Each step is logged
        (:mod:`miles_lite.rollout.startup`).

        Raises ``ConfigError`` for an engine URL without ``http://``, and
        ``EngineUnavailableError`` naming the URLs when no engine answers ``/health``
        within ``config.engines.router.ready_timeout_s`` (5 s by default; engines still
        loading weights need more), and ``RewardError`` when a reward cannot load.

        ``rewards`` maps a kind to a reward function (a pool of ``config.reward_workers``
        processes), an async scorer with ``score``, or a ready pool. A ``config.reward``
        or ``config.group_reward`` it does not hold is a built-in reward by name
        (:data:`~miles_lite.rewards.BUILTIN_REWARDS`: ``math``, ``deepscaler``, ``dapo``,
        ``f1``), else a ``ConfigError`` naming the built-ins, raised before anything
        starts. ``journal``: a path or a :class:`~miles_lite.training.Journal`: what the
        rollout makes is journaled there, so a crashed run resumes (``resume()``,
        ``commit()``; see :mod:`miles_lite.training`); a file of another run raises
        ``JournalError``. Other keywords go to the constructor.
        """
        from miles_lite.rewards.builtin import with_builtin_rewards  # loads the rewards on use

        config = config or TextRolloutConfig()
        rewards = with_builtin_rewards(rewards or {}, [config.reward])
        rewards = with_builtin_rewards(rewards, [config.group_reward], field="group_reward")
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(EngineClient(config.engines.client))
            router = await stack.enter_async_context(
                Router(engine_urls, client, config.engines.router)
            )
            with startup_step(f"waiting for {len(router.urls)} engine(s) to answer /health"):
                await router.wait_ready()
            pools = await open_reward_pools(stack, rewards, config, arena=None)
            if journal is not None:  # a path is opened here and closed on exit
                from miles_lite.text.progress import stream_progress
                from miles_lite.training.recorder import open_journal

                kwargs["journal"] = await stack.enter_async_context(
                    open_journal(journal, kind="text", config=config, progress=stream_progress)
                )
            rollout = cls(
                config=config,
                router=router,
                tokenizer=tokenizer,
                rewards=pools,
                generate=generate,
                **kwargs,
            )
            if isinstance(rollout.generate, BindsContext):
                with startup_step(f"binding {type(rollout.generate).__name__}"):
                    await stack.enter_async_context(rollout.generate.bind(rollout.context))
            yield rollout
