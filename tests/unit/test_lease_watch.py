"""A lease's watch stops when it is told to, even as its check answers.

Python 3.11's `asyncio.wait_for` returned the awaited result when a cancellation
of its caller came in the same turn of the loop as that result: the watch then
went on checking forever, and the service stopping (which waits for the watch)
hung. The connection here is a stand-in whose answer the test releases in the
same turn as the cancellation, which real sockets do only by chance."""

from __future__ import annotations

import asyncio
from typing import Any

from runyard.stack.leader import Lease, Presence, _watch


class _Conn:
    """Answers each lock check when the test says so."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[asyncio.Future[bool]] = asyncio.Queue()

    async def fetchval(self, query: str, *args: Any) -> bool:
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self.answers.put(answer)
        return await answer


async def _cancel_as_it_answers(task: asyncio.Task[None], conn: _Conn) -> None:
    for _ in range(2):  # a check answered normally first: the loop goes on
        answer = await asyncio.wait_for(conn.answers.get(), 5)
        answer.set_result(True)
    answer = await asyncio.wait_for(conn.answers.get(), 5)
    answer.set_result(True)
    task.cancel()  # the same turn as the answer
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done, "the watch went on after it was cancelled"
    assert task.cancelled()


async def test_a_lease_watch_cancelled_as_its_check_answers_stops() -> None:
    conn = _Conn()
    lease = Lease("scheduler", 1)
    watch = asyncio.create_task(_watch(conn, lease, 0.001, 5.0))
    await _cancel_as_it_answers(watch, conn)
    assert not lease.lost.is_set()


async def test_a_presence_cancelled_as_its_check_answers_stops() -> None:
    conn = _Conn()
    presence = Presence("unused", "notification", check_s=0.001)
    presence._conn = conn
    keeper = asyncio.create_task(presence._keep())
    await _cancel_as_it_answers(keeper, conn)
