"""Leadership leases on the real Postgres: one active holder, a standby that takes over;
and presences, held while their process lives."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from runyard.stack.leader import (
    Leadership,
    Lease,
    Presence,
    WorkDidNotStop,
    held_sql,
    leadership,
    lease_key,
)

pytestmark = pytest.mark.integration

FAST = {"retry_s": 0.1, "check_s": 0.1, "check_timeout_s": 2.0}


async def _terminate_holder(dsn: str, name: str, scope: str = "") -> int:
    """End the session holding lease `name` (as a killed or cut-off holder's would end)."""
    return await _terminate_key(dsn, lease_key(name, scope))


async def _terminate_key(dsn: str, key: int) -> int:
    """End the sessions holding advisory lock `key`; how many there were."""
    admin = await asyncpg.connect(dsn)
    try:
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted AND objsubid = 1"
                " AND classid::bigint = ($1::bigint >> 32) & 4294967295"
                " AND objid::bigint = $1::bigint & 4294967295",
                key,
            )
        )
    finally:
        await admin.close()


async def _hold(dsn: str, name: str, held: asyncio.Queue[Lease], **options: object) -> None:
    async with leadership(dsn, name, **FAST, **options) as lease:  # type: ignore[arg-type]
        await held.put(lease)
        await asyncio.Event().wait()


def test_keys_differ_by_name_and_scope() -> None:
    keys = {lease_key("scheduler"), lease_key("relay"), lease_key("scheduler", "t1.")}
    assert len(keys) == 3
    assert lease_key("scheduler", "t1.") == lease_key("scheduler", "t1.")
    assert all(-(2**63) <= k < 2**63 for k in keys)


async def test_one_holder_the_other_stands_by_then_takes_over(dsn: str) -> None:
    held: asyncio.Queue[Lease] = asyncio.Queue()
    first = asyncio.create_task(_hold(dsn, "scheduler", held))
    lease_a = await asyncio.wait_for(held.get(), 10)
    second = asyncio.create_task(_hold(dsn, "scheduler", held))
    try:
        # the second contender polls ten times a second: after a few polls it still waits
        await asyncio.sleep(0.5)
        assert held.empty() and not second.done()

        assert await _terminate_holder(dsn, "scheduler") == 1
        await asyncio.wait_for(lease_a.lost.wait(), 10)  # the old holder knows
        lease_b = await asyncio.wait_for(held.get(), 10)  # the standby took over
        assert not lease_b.lost.is_set()
    finally:
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def test_scopes_do_not_collide(dsn: str) -> None:
    held: asyncio.Queue[Lease] = asyncio.Queue()
    tasks = [
        asyncio.create_task(_hold(dsn, "relay", held, scope="a.")),
        asyncio.create_task(_hold(dsn, "relay", held, scope="b.")),
    ]
    try:
        leases = [await asyncio.wait_for(held.get(), 10) for _ in tasks]
        keys = {lease_key("relay", "a."), lease_key("relay", "b.")}
        assert {lease.key for lease in leases} == keys
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_leaving_the_block_releases_the_lease(dsn: str) -> None:
    async with leadership(dsn, "once", **FAST):  # type: ignore[arg-type]
        pass
    async with leadership(dsn, "once", **FAST) as lease:  # type: ignore[arg-type]
        assert not lease.lost.is_set()


async def test_run_cancels_the_work_on_loss_and_stands_by_again(dsn: str) -> None:
    """Two contenders running work: exactly one works at a time; killing the active one's
    lease cancels its work, the other starts, and the first becomes its standby."""
    working: set[str] = set()
    overlaps: list[set[str]] = []
    started: asyncio.Queue[str] = asyncio.Queue()

    def work_of(who: str) -> Callable[[Lease], Awaitable[None]]:
        async def work(lease: Lease) -> None:
            if working:
                overlaps.append({*working, who})
            working.add(who)
            await started.put(who)
            try:
                await asyncio.Event().wait()
            finally:
                working.discard(who)

        return work

    contenders = {who: Leadership(dsn, "scheduler", **FAST) for who in ("a", "b")}  # type: ignore[arg-type]
    tasks = [asyncio.create_task(c.run(work_of(who))) for who, c in contenders.items()]
    try:
        first = await asyncio.wait_for(started.get(), 10)
        other = "b" if first == "a" else "a"
        assert contenders[first].role == "active"
        assert contenders[other].role == "standby"

        await _terminate_holder(dsn, "scheduler")
        second = await asyncio.wait_for(started.get(), 10)
        if second == first:  # the old holder won the race back: fine, it stood by first
            assert contenders[first].terms == 2
        else:
            assert contenders[other].role == "active"
        assert not overlaps
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_run_returns_when_the_work_returns_and_raises_its_error(dsn: str) -> None:
    async def done(lease: Lease) -> None:
        return None

    async def broken(lease: Lease) -> None:
        raise ValueError("boom")

    await asyncio.wait_for(Leadership(dsn, "x", **FAST).run(done), 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(Leadership(dsn, "x", **FAST).run(broken), 10)  # type: ignore[arg-type]
    async with leadership(dsn, "x", **FAST):  # type: ignore[arg-type]
        pass  # released after the error


async def test_a_stop_while_the_work_winds_down_stops_run(dsn: str) -> None:
    """The service is stopped (SIGTERM) just as its lease is lost: run must stop too,
    not stand by and take the lease again once the work has wound down."""
    winding_down = asyncio.Event()

    async def work(lease: Lease) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            winding_down.set()
            await asyncio.sleep(1.0)  # a slow cleanup (a producer flushing)

    contender = Leadership(dsn, "relay", **FAST)  # type: ignore[arg-type]
    task = asyncio.create_task(contender.run(work))
    try:
        await wait_until(lambda: contender.role == "active")
        await _terminate_holder(dsn, "relay")
        await asyncio.wait_for(winding_down.wait(), 10)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done and task.cancelled(), "run went on after it was stopped"
        assert contender.terms == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_work_that_does_not_stop_when_cancelled_is_an_error_of_run(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Work that swallows its cancellation would keep the service in a term it lost
    (a relay that publishes nothing): run raises, with where the work is stuck."""
    released = asyncio.Event()

    async def stuck(lease: Lease) -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the bug: a stop swallowed
                await released.wait()

    contender = Leadership(dsn, "relay", stop_within_s=0.5, **FAST)  # type: ignore[arg-type]
    task = asyncio.create_task(contender.run(stuck))
    try:
        await wait_until(lambda: contender.role == "active")
        await _terminate_holder(dsn, "relay")
        with pytest.raises(WorkDidNotStop, match="did not stop within"):
            await asyncio.wait_for(task, 10)
        assert "it is stuck at" in caplog.text and "in stuck" in caplog.text
        assert contender.role == "standby"
    finally:
        released.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_work_that_returns_when_cancelled_on_a_loss_is_not_done(dsn: str) -> None:
    """Work that ends without an error when cancelled on a lost lease swallowed its
    stop; it did not finish its job: run stands by and starts it again."""
    started = 0

    async def swallows(lease: Lease) -> None:
        nonlocal started
        started += 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    contender = Leadership(dsn, "relay", **FAST)  # type: ignore[arg-type]
    task = asyncio.create_task(contender.run(swallows))
    try:
        await wait_until(lambda: started == 1)
        await _terminate_holder(dsn, "relay")
        await wait_until(lambda: started == 2)
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_until(condition: Callable[[], object], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# -- presence -------------------------------------------------------------------------

HELD = f"SELECT {held_sql('$1::bigint')}"


async def _held(dsn: str, key: int) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval(HELD, key))
    finally:
        await conn.close()


async def test_a_presence_is_held_while_it_lives_and_taken_again_when_its_session_ends(
    dsn: str,
) -> None:
    async with Presence(dsn, "svc", **FAST) as one, Presence(dsn, "svc", **FAST) as two:
        assert one.key != two.key and one.key > 0 and two.key > 0
        assert await _held(dsn, one.key) and await _held(dsn, two.key)
        assert not await _held(dsn, one.key + 1), "a key nobody holds is not held"

        # The server ends its session (an operator, a Postgres restart): it connects again.
        assert await _terminate_key(dsn, one.key) == 1
        deadline = time.monotonic() + 10
        while not await _held(dsn, one.key):
            assert time.monotonic() < deadline, "the presence was not taken again"
            await asyncio.sleep(0.05)
        assert await _held(dsn, two.key)
    assert not await _held(dsn, one.key), "leaving the block ends the presence"
    assert not await _held(dsn, two.key)
