"""The main-worker link of the session server (``agentic/ipc.py``) over a real loopback
socket, both ends in this process: replies, failures with their trace, cancellation
reaching the other side, a lost link failing what waits, records packed and back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from miles_lite.agentic.ipc import Link, pack_record, unpack_record
from miles_lite.errors import WorkerCrashedError, WorkerTaskError
from miles_lite.sglang.chat_wire import TurnRecord
from miles_lite.types import WeightSpan
from tests.support.polling import wait_until

pytestmark = pytest.mark.anyio


class Other:
    """The answering end: echoes, raises, or sleeps until cancelled; keeps notices."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, list[Any]]] = []
        self.cancelled = anyio.Event()
        self.release = anyio.Event()
        self.holding = 0
        #: Loop steps counted by :meth:`count_steps` (``step`` answers the count).
        self.steps = 0

    async def count_steps(self) -> None:
        """Count the loop's steps: one a pass through the loop's ready tasks."""
        while True:
            await anyio.lowlevel.checkpoint()
            self.steps += 1

    async def requests(self, kind: str, args: list[Any]) -> Any:
        if kind == "echo":
            return args
        if kind == "step":
            return self.steps
        if kind == "hold":  # until released
            self.holding += 1
            await self.release.wait()
            self.holding -= 1
            return args
        if kind == "sleep":
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()
                raise
        raise ValueError(f"no {kind!r} here")

    def notice(self, kind: str, args: list[Any]) -> None:
        self.notices.append((kind, args))


@asynccontextmanager
async def linked() -> AsyncIterator[tuple[Link, Other, Link]]:
    """``(asker, other, answerer)``: two links over one loopback connection."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listeners:
        listener = listeners.listeners[0]
        assert isinstance(listener, anyio.abc.SocketListener)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        accepted: list[Any] = []

        async def accept() -> None:
            accepted.append(await listener.accept())

        async with anyio.create_task_group() as tg:
            tg.start_soon(accept)
            client = await anyio.connect_tcp("127.0.0.1", port)
        asker, answerer, other = (
            Link(client, "the answerer"),
            Link(accepted[0], "the asker"),
            Other(),
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(asker.serve, Other().requests, lambda kind, args: None, tg)
            tg.start_soon(answerer.serve, other.requests, other.notice, tg)
            try:
                yield asker, other, answerer
            finally:
                await asker.aclose()
                await answerer.aclose()
                tg.cancel_scope.cancel()


async def test_replies_failures_and_notices_in_order() -> None:
    async with linked() as (asker, other, _):
        assert await asker.call("echo", 1, b"\x00bytes", [2.5]) == [1, b"\x00bytes", [2.5]]
        with pytest.raises(WorkerTaskError, match="no 'nope' here") as failed:
            await asker.call("nope")
        assert "ValueError" in failed.value.remote_traceback
        for i in range(50):
            await asker.post("n", i)
        await asker.flushed()
        await asker.call("echo")  # after every notice sent before it
        assert [args[0] for _, args in other.notices] == list(range(50))


async def test_a_burst_of_requests_is_started_a_few_a_loop_step() -> None:
    # 40 calls queued in one step go out in one write and arrive in one read; the reader
    # starts a few, then lets the loop's other tasks run, so the burst's work is spread
    # over loop steps (all 40 in one step without the bound).
    async with linked() as (asker, other, _), anyio.create_task_group() as tg:
        tg.start_soon(other.count_steps)
        answers: list[int] = []

        async def ask() -> None:
            answers.append(await asker.call("step"))

        async with anyio.create_task_group() as burst:
            for _ in range(40):
                burst.start_soon(ask)
        tg.cancel_scope.cancel()
    assert len(answers) == 40
    assert len(set(answers)) >= 8


async def test_a_cancelled_call_cancels_its_work_on_the_other_side() -> None:
    async with linked() as (asker, other, _):
        with anyio.move_on_after(0.2):
            await asker.call("sleep")
        with anyio.fail_after(5):
            await other.cancelled.wait()
        assert await asker.call("echo", "still") == ["still"]


async def test_a_lost_link_fails_what_waits_and_what_is_asked_after() -> None:
    async with linked() as (asker, _, answerer):
        failures: list[BaseException] = []

        async def waiting() -> None:
            try:
                await asker.call("sleep")
            except WorkerCrashedError as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting)
            await anyio.sleep(0.1)
            await answerer.aclose()
        assert len(failures) == 1 and "did not answer" in str(failures[0])
        with pytest.raises(WorkerCrashedError, match="nothing more can be asked"):
            await asker.call("echo")


async def test_requests_reuse_idle_answerers_and_they_end_with_the_link() -> None:
    async with linked() as (asker, other, answerer):
        for i in range(50):  # one after the other: one answerer answers them all
            assert await asker.call("echo", i) == [i]
        assert answerer.answerers_started == 1
        # A request cancelled mid-answer leaves its answerer serving the next one (idle
        # again in the step in which its work saw the cancellation).
        with anyio.move_on_after(0.2):
            await asker.call("sleep")
        with anyio.fail_after(5):
            await other.cancelled.wait()
        assert await asker.call("echo", "next") == ["next"]
        assert answerer.answerers_started == 1
        # Eight held at once: eight answerers, idle again once released, and kept: a
        # second burst of eight starts none.
        for _ in range(2):
            other.release = anyio.Event()
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(asker.call, "hold", i)
                await wait_until(lambda: other.holding == 8)
                other.release.set()
            assert answerer.answerers_started == answerer.answerers == 8
        # The link lost: the idle answerers end (their task group is not cancelled).
        await asker.aclose()
        await wait_until(lambda: answerer.answerers == 0)


def test_a_record_packs_into_arrays_and_back_unchanged() -> None:
    record = TurnRecord(
        rid="r1",
        engine_url="http://e",
        prompt_ids=[1, 2, 151643],
        output_ids=[7, 8],
        output_log_probs=[-0.125, -3.0e-7],
        finish_reason="stop",
        weight_version="2",
        weight_spans=(WeightSpan("1", 0, 1), WeightSpan("2", 1, 2, kv_version="1")),
        cached_tokens=2,
        prefix_len=5,
        request={"max_tokens": 8},
        response={"id": "x"},
    )
    packed = pack_record(record)
    assert isinstance(packed[2], bytes) and len(packed[2]) == 3 * 4  # 4 bytes an id
    assert unpack_record(packed) == record
