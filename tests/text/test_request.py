"""One /generate request: a request still waiting for an engine slot when its run stops
is never sent; a request that timed out is aborted at its engine."""

from __future__ import annotations

import anyio
import pytest

from miles_lite.engine.config import EngineClientConfig, RetryPolicy
from miles_lite.errors import EngineTimeoutError
from miles_lite.sglang.generate_wire import build_generate_payload, new_rid
from miles_lite.testing import TextPolicy, TextStandInConfig
from miles_lite.text.request import post_generate
from tests.support.polling import wait_until

from .conftest import OpenState

pytestmark = pytest.mark.anyio

SLOW = TextStandInConfig(policy=TextPolicy(default_length=400), token_latency_s=0.01)


def payload(rid: str, max_new_tokens: int = 400) -> dict[str, object]:
    return build_generate_payload(
        input_ids=[1, 2, 3], sampling_params={"max_new_tokens": max_new_tokens}, rid=rid
    )


async def test_a_request_waiting_for_a_slot_at_the_stop_is_never_sent(
    text_state: OpenState,
) -> None:
    async with text_state(engine=SLOW, max_inflight_per_engine=1) as (direct, engine):
        router, run = direct.context.router, direct.run
        rid = new_rid()
        answers: list[object] = []

        async def waiting() -> None:
            answers.append(await post_generate(direct.context, run, payload(rid)))

        async with anyio.create_task_group() as tg, router.lease():  # the only slot is taken
            tg.start_soon(waiting)
            await wait_until(lambda: len(run.in_flight) == 1)
            await anyio.sleep(0.05)  # at the lease, waiting for the slot
            run.stop.set()  # the early stop: its aborts went out before the slot frees
        assert answers == [None]
        assert rid not in engine.stats.rids_seen and engine.stats.requests == []
        assert len(run.in_flight) == 0


async def test_a_request_that_timed_out_is_aborted_at_its_engine(text_state: OpenState) -> None:
    client = EngineClientConfig(total_timeout_s=0.3, retry=RetryPolicy(max_attempts=1))
    async with text_state(engine=SLOW, client=client) as (direct, engine):
        rid = new_rid()
        with pytest.raises(EngineTimeoutError) as caught:
            await post_generate(direct.context, direct.run, payload(rid))
        assert caught.value.request_id == rid and caught.value.url == engine.url
        # The engine learns of it from the abort, not only from the closed connection.
        assert [body.get("rid") for body in engine.stats.aborts] == [rid]
        await wait_until(lambda: engine.stats.running == 0)
        assert engine.stats.generated_tokens < 400
