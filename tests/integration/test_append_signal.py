"""The append signal on a real Postgres: an append after a quiet spell wakes a
listener, appends close together do not, a listener whose connection is
killed listens again, and one cancelled as its connection is lost stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from runyard.eventstore import PostgresEventStore
from runyard.eventstore.appended import AppendSignal

from tests.contract.sample_events import happened, sample_mapper

pytestmark = pytest.mark.integration

_LISTENERS = (
    "SELECT pid FROM pg_stat_activity"
    " WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
)


async def wait_until(condition: Callable[[], object], within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def listening(store: PostgresEventStore) -> AsyncIterator[AppendSignal]:
    signal = AppendSignal(store.pool)
    task = asyncio.create_task(signal.run())
    try:
        await wait_until(lambda: signal.listening)
        yield signal
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_append_after_a_quiet_spell_wakes_the_signal(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    store.notify_after_quiet_s = 60.0
    try:
        async with listening(store) as signal:
            signal.clear()
            assert await signal.wait(0.3) is False, "nothing was appended"

            signal.clear()
            await store.append("test-1", [happened(1), happened(2)])
            assert await signal.wait(30) is True, "the first append is announced"

            signal.clear()
            await store.append("test-1", [happened(3)])
            assert await signal.wait(0.3) is False, "the next, a moment later, is not"

            store.notify_after_quiet_s = 0
            # A transaction that rolls back appends nothing and tells no one.
            signal.clear()
            with contextlib.suppress(RuntimeError):
                async with store.transaction() as conn:
                    await store.append_in(conn, "test-2", [happened(4)])
                    raise RuntimeError("roll back")
            assert await signal.wait(0.3) is False
            # One that commits is announced once it has committed.
            async with store.transaction() as conn:
                await store.append_in(conn, "test-2", [happened(5)])
                assert await signal.wait(0.3) is False, "not before the commit"
            assert await signal.wait(30) is True
        # Stopped: its connection went back to the pool without its LISTEN.
        assert await store.pool.fetch(_LISTENERS) == []
    finally:
        await store.close()


async def test_a_listener_whose_connection_is_killed_listens_again(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    try:
        async with listening(store) as signal:
            [first] = [r["pid"] for r in await store.pool.fetch(_LISTENERS)]
            await store.pool.execute("SELECT pg_terminate_backend($1)", first)
            again: list[int] = []

            async def listens_again() -> None:
                while not (signal.listening and again and again != [first]):
                    again[:] = [r["pid"] for r in await store.pool.fetch(_LISTENERS)]
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(listens_again(), 30)
            signal.clear()
            await store.append("test-1", [happened(1)])  # the store's first: announced
            assert await signal.wait(30) is True
        # A lost connection is an outage, not an error to warn of.
        assert "not listening" not in caplog.text
    finally:
        await store.close()


async def test_a_listener_cancelled_as_its_connection_is_lost_stops(dsn: str) -> None:
    """As in a database crash: the connection is lost and the listener cancelled at once
    (its owner stepped down). asyncpg has then given the lost connection back to the
    pool, so every call on it in the listener's cleanup raises; the listener stops all
    the same, instead of taking that error for an outage to wait out."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    signal = AppendSignal(pool)
    task = asyncio.create_task(signal.run())
    try:
        await wait_until(lambda: signal.listening)
        pool.terminate()  # every connection lost at once, the listener's too
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done, "the listener did not stop when cancelled"
        assert task.cancelled()
    finally:
        if not task.done():
            task.cancel()
        pool.terminate()
