"""The text rollout: the driver's units are single samples over SGLang ``/generate`` or chat.

Each sample is one unit (a task): its generate function sends one or more requests
(single turn, multi-turn tool calls, an agent's chat turns through the session server),
each with its own rid, then the sample is scored at once in a reward pool. Groups are
``n_samples_per_prompt`` single requests (SGLang replaces rids for ``n > 1``, so a group
cannot be aborted as one request).

Early stop (oversampling satisfied): the state's stop flag keeps multi-turn samples from
sending a new turn; every rid still in flight is aborted at the engines
(``/abort_request``, bounded, then ``/v1/loads`` polled until idle); sessions answer
later agent requests with ``finish_reason=abort``; the generate function's ``abort`` hook
(an agent's) is called once. Samples come back ABORTED with their partial output in
``result.partial``, ready to resume in the next ``run()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from miles_lite.engine.client import EngineClient
from miles_lite.engine.config import EngineClientConfig, RouterConfig
from miles_lite.engine.control import abort_requests
from miles_lite.engine.router import Router
from miles_lite.pools.reward_pool import RewardPoolLike
from miles_lite.rollout.config import TextRolloutConfig
from miles_lite.rollout.contract import GenerateFn
from miles_lite.rollout.filters import GroupFilter
from miles_lite.rollout.result import RolloutResult
from miles_lite.rollout.rollout import RolloutBase, reward_pools
from miles_lite.rollout.spans import UnitSpan
from miles_lite.text.context import TextState
from miles_lite.text.metrics import text_metrics
from miles_lite.text.request import check_text_sample
from miles_lite.text.single_turn import generate as single_turn
from miles_lite.types import Sample

if TYPE_CHECKING:
    from miles_lite.agentic.server import SessionServerConfig

__all__ = ["AbortContext", "TextRollout"]


@dataclass(frozen=True, slots=True)
class AbortContext:
    """What a generate function's ``abort`` hook gets on early stop: the rollout id and
    the ids of the sessions still open (agents find their work by them)."""

    rollout_id: int
    session_ids: tuple[str, ...]


class TextRollout(RolloutBase):
    """Runs text rollouts over SGLang engines (``/generate``, or chat through sessions).

    Parts are passed in and stay the caller's to close; :meth:`open` builds and closes
    them for you. ``generate`` is a generate function (default: single turn);
    ``generate_options`` what it gets as ``input.options``; ``rewards`` reward pools by
    kind; ``dynamic_filter`` one filter or a list; ``progress`` a tqdm bar in samples.
    """

    config: TextRolloutConfig

    def __init__(
        self,
        *,
        config: TextRolloutConfig,
        router: Router,
        tokenizer: Any,
        processor: Any = None,
        rewards: Mapping[str, RewardPoolLike] | None = None,
        generate: GenerateFn | None = None,
        generate_options: Mapping[str, Any] | None = None,
        dynamic_filter: GroupFilter | Sequence[GroupFilter] | None = None,
        progress: bool = False,
        sessions: Any = None,
    ) -> None:
        self.config = config
        self.generate = generate or single_turn
        self.generate_options = dict(generate_options or {})
        self.state = TextState(
            tokenizer=tokenizer,
            processor=processor,
            router=router,
            sampling=config.sampling,
            max_context_len=config.max_context_len,
            sessions=sessions,
        )
        self._kind = _TextKind(self)
        self._init_driver(
            self._kind,
            rewards,
            dynamic_filter,
            progress=progress,
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
        client_config: EngineClientConfig | None = None,
        router_config: RouterConfig | None = None,
        rewards: Mapping[str, Any] | None = None,
        reward_workers: int = 1,
        session_server: SessionServerConfig | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[TextRollout]:
        """Build the engine client, router and reward pools, yield a rollout, close them.

        ``router_config`` defaults to 256 requests in flight per engine (text engines batch
        hundreds of requests; miles' default concurrency is 512 per engine group).
        ``rewards`` maps a kind to a reward function, an async scorer or a ready pool, as
        for :meth:`DiffusionRollout.open`. ``session_server``: start a chat
        :class:`~miles_lite.sessions.SessionServer` for agentic generate functions
        (``state.sessions``), stopped on exit.
        """
        config = config or TextRolloutConfig()
        router_config = router_config or RouterConfig(max_inflight_per_engine=256)
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(EngineClient(client_config))
            router = await stack.enter_async_context(Router(engine_urls, client, router_config))
            pools = await reward_pools(stack, rewards or {}, workers=reward_workers, arena=None)
            rollout = cls(
                config=config, router=router, tokenizer=tokenizer, rewards=pools, **kwargs
            )
            if session_server is not None:
                from miles_lite.agentic.server import SessionServer

                rollout.state.sessions = await stack.enter_async_context(
                    SessionServer(rollout.state, session_server)
                )
            yield rollout

    def _before_run(self, rollout_id: int) -> None:
        self.state.reset_stop()
        self._kind.rollout_id = rollout_id
        self._kind.abort_metrics = {}

    def _after_run(self, result: RolloutResult) -> None:
        result.metrics.update(
            text_metrics(
                result.samples,
                rollout_time_s=result.metrics.get("perf/rollout_time"),
                reward_key=self.config.reward_key,
            )
        )
        result.metrics.update(self._kind.abort_metrics)


class _TextKind:
    """What the driver needs of text: one sample per unit, aborts at the engines."""

    drain_on_stop = True  # aborted requests come back with their partial output

    def __init__(self, rollout: TextRollout) -> None:
        self.rollout = rollout
        self.rollout_id = 0
        self.abort_metrics: dict[str, float] = {}
        self.abort_hook_error: Exception | None = None

    def units(self, group: list[Sample]) -> list[list[Sample]]:
        return [[sample] for sample in group]

    async def generate(self, unit: list[Sample], span: UnitSpan) -> list[Sample]:
        made = await self.rollout.call_generate(unit, span)
        for sample in made:
            check_text_sample(sample)
        return made

    async def abort(self) -> None:
        rollout = self.rollout
        state = rollout.state
        state.request_stop()
        config = rollout.config
        router = state.router
        sessions = state.sessions
        # Read before aborting: agents close their sessions once answered "abort".
        session_ids = tuple(sessions.session_ids()) if sessions is not None else ()
        if sessions is not None:
            # Later agent requests are answered at once with finish_reason "abort".
            await sessions.abort()
        rids = state.in_flight.rids()
        # A rid is unique (uuid4 hex): sending it to an engine that does not run it is a
        # no-op there, so every engine gets every rid.
        report = await abort_requests(
            router.client,
            dict.fromkeys(router.urls, rids),
            abort_all=config.abort_all_on_stop,
            timeout_s=config.stop_timeout_s / 2,
            settle_timeout_s=config.stop_timeout_s / 2,
        )
        self.abort_metrics = {
            "perf/abort_time": report.elapsed_s,
            "rollout/abort_engines_not_idle": float(sum(not e.idle for e in report.engines)),
        }
        hook = getattr(rollout.generate, "abort", None)
        if hook is not None:
            try:
                await hook(AbortContext(rollout_id=self.rollout_id, session_ids=session_ids))
            except Exception as exc:  # reported, not fatal: the rollout's work is done
                self.abort_metrics["rollout/abort_hook_errors"] = 1.0
                self.abort_hook_error = exc

    @contextmanager
    def measure(self) -> Iterator[Callable[[], dict[str, float]]]:
        yield dict

    def sample_metrics(self, samples: list[Sample]) -> dict[str, float]:
        return {}
