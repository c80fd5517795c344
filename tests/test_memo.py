"""Shared calls by key (``_core/memo.py``): callers of one key share the call in flight and
then its kept result, each with its own copy; a failed or cancelled call is shared with
nobody (each waiter makes its own); a waiter that leaves does not cancel the call; only the
most recent keys are kept."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from miles_lite._core.memo import SharedCalls

pytestmark = pytest.mark.anyio

Memo = SharedCalls[list[str], list[str]]


class Maker:
    """``make()`` for a key: counts its calls (``called`` is set by each), waits for ``release`` (when given), then
    gives ``[key]`` or raises ``fail``."""

    def __init__(self, key: str, fail: BaseException | None = None) -> None:
        self.key = key
        self.fail = fail
        self.calls = 0
        self.release: anyio.Event | None = anyio.Event()
        self.called = anyio.Event()  # set by each call

    async def __call__(self) -> list[str]:
        self.calls += 1
        self.called.set()
        if self.release is not None:
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [self.key]


def getter(memo: Memo, make: Maker, got: list[list[str]]) -> Callable[[], Awaitable[None]]:
    """A task's body: get ``make``'s key from ``memo`` into ``got``."""

    async def get() -> None:
        got.append(await memo.get(make.key, make))

    return get


async def test_callers_share_the_call_in_flight_then_its_kept_result() -> None:
    memo: Memo = SharedCalls(list.copy)
    make = Maker("a")
    got: list[list[str]] = []
    get = getter(memo, make, got)

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(get)
        await anyio.wait_all_tasks_blocked()
        assert make.calls == 1
        assert make.release is not None
        make.release.set()
    assert got == [["a"]] * 5 and len({id(v) for v in got}) == 5  # a copy each
    got[0].append("changed")
    assert await memo.get("a", make) == ["a"]  # kept, unchanged by a caller
    assert (make.calls, memo.calls, memo.shared) == (1, 1, 5)


async def test_a_failed_call_is_made_again_by_each_waiter() -> None:
    memo: Memo = SharedCalls(list.copy)
    make = Maker("a", fail=ValueError("bad template"))
    errors: list[BaseException] = []

    async def get() -> None:
        try:
            await memo.get("a", make)
        except ValueError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(get)
        await anyio.wait_all_tasks_blocked()
        assert make.calls == 1
        assert make.release is not None
        make.release.set()
    assert len(errors) == 3 and make.calls == 3 and memo.shared == 0
    assert len(memo) == 0  # nothing kept: the next caller tries again
    make.fail = None
    assert await memo.get("a", make) == ["a"] and make.calls == 4


async def test_a_cancelled_maker_leaves_its_waiters_to_make_their_own() -> None:
    memo: Memo = SharedCalls(list.copy)
    make = Maker("a")
    got: list[list[str]] = []
    scopes: list[anyio.CancelScope] = []

    async def maker() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await memo.get("a", make)

    async with anyio.create_task_group() as tg:
        tg.start_soon(maker)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(getter(memo, make, got))
        await anyio.wait_all_tasks_blocked()
        assert make.calls == 1
        make.called = anyio.Event()
        scopes[0].cancel()
        with anyio.fail_after(5):  # the waiter makes its own call: no error, no hang
            await make.called.wait()
        assert make.calls == 2
        assert make.release is not None
        make.release.set()
    assert got == [["a"]] and memo.shared == 0


async def test_a_waiter_that_leaves_does_not_cancel_the_call() -> None:
    memo: Memo = SharedCalls(list.copy)
    make = Maker("a")
    got: list[list[str]] = []
    get = getter(memo, make, got)

    async with anyio.create_task_group() as tg:
        tg.start_soon(get)  # the maker
        await anyio.wait_all_tasks_blocked()
        with anyio.move_on_after(0.01) as waiter:
            await memo.get("a", make)
        assert waiter.cancelled_caught
        assert make.release is not None
        make.release.set()
    assert got == [["a"]] and make.calls == 1


async def test_only_the_most_recent_keys_are_kept() -> None:
    memo: Memo = SharedCalls(list.copy, size=2)
    makers = {k: Maker(k) for k in "abc"}
    for maker in makers.values():
        maker.release = None
    for key in "ab":
        await memo.get(key, makers[key])
    await memo.get("a", makers["a"])  # "a" is now the most recent
    await memo.get("c", makers["c"])  # "b" goes
    assert len(memo) == 2
    for key in "abc":
        await memo.get(key, makers[key])
    assert [makers[k].calls for k in "abc"] == [1, 2, 2]
    with pytest.raises(ValueError, match="size must be >= 1"):
        SharedCalls(list.copy, size=0)
    with pytest.raises(ValueError, match="cost and budget go together"):
        SharedCalls(list.copy, budget=10)


async def test_results_are_kept_within_their_budget_and_given_as_asked() -> None:
    # Kept compact (a tuple), given as each caller's own list; at most 5 items kept.
    memo: SharedCalls[tuple[str, ...], list[str]] = SharedCalls(list, cost=len, budget=5)

    def make(key: str, n: int) -> Callable[[], Awaitable[tuple[str, ...]]]:
        async def call() -> tuple[str, ...]:
            made.append(key)
            return (key,) * n

        return call

    made: list[str] = []
    assert await memo.get("a", make("a", 2)) == ["a", "a"]
    assert await memo.get("b", make("b", 3)) == ["b"] * 3
    assert memo.kept_cost == 5
    assert await memo.get("a", make("a", 2)) == ["a", "a"]  # kept: "a" is now the most recent
    assert await memo.get("c", make("c", 2)) == ["c", "c"]  # "b" goes for it
    assert memo.kept_cost == 4 and len(memo) == 2
    assert await memo.get("big", make("big", 6)) == ["big"] * 6  # above the budget: not kept
    assert memo.kept_cost == 4 and len(memo) == 2
    for key, n in (("a", 2), ("b", 3), ("big", 6)):
        await memo.get(key, make(key, n))
    assert made == ["a", "b", "c", "big", "b", "big"]
