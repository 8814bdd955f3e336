"""`StreamLocks`: one decision at a time per stream, and no lock kept for a stream
nobody holds or waits for (a service writes to every task it ever saw)."""

from __future__ import annotations

import asyncio

import pytest
from runyard.eventstore import StreamLocks


async def test_one_holder_at_a_time_per_stream_and_others_run_freely() -> None:
    locks = StreamLocks()
    order: list[str] = []
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def holder(name: str, stream: str, wait: asyncio.Event | None = None) -> None:
        async with locks.hold(stream):
            order.append(f"{name} in")
            if wait is not None:
                first_in.set()
                await wait.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(holder("a", "task-1", release))
    await first_in.wait()
    second = asyncio.create_task(holder("b", "task-1"))
    other = asyncio.create_task(holder("c", "task-2"))
    await other
    await asyncio.sleep(0.01)
    assert order == ["a in", "c in", "c out"], "b waits for a; c does not"
    assert len(locks) == 1, "task-1: held by a, waited for by b"
    release.set()
    await asyncio.gather(first, second)
    assert order[3:] == ["a out", "b in", "b out"]
    assert len(locks) == 0


async def test_a_holder_that_fails_lets_go_of_the_lock() -> None:
    locks = StreamLocks()
    with pytest.raises(RuntimeError):
        async with locks.hold("task-1"):
            raise RuntimeError("the decision failed")
    assert len(locks) == 0
    async with locks.hold("task-1"):  # free again
        assert len(locks) == 1


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    locks = StreamLocks()
    async with locks.hold("task-1"):
        waiter = asyncio.create_task(_hold_once(locks, "task-1"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert len(locks) == 1
    assert len(locks) == 0


async def _hold_once(locks: StreamLocks, stream: str) -> None:
    async with locks.hold(stream):
        pass
