"""The gap-safe all-stream reader over a real Postgres: a position held by a
transaction still open is waited for (never skipped), a position whose
transaction rolled back is given up once no open transaction can fill it, and
once a gap is over the reader goes back to its normal polling."""

from __future__ import annotations

import asyncio

import pytest
from runyard.eventstore import PostgresEventStore

from tests.contract.sample_events import happened, sample_mapper

pytestmark = pytest.mark.integration

POLL_S = 0.05


async def test_a_gap_is_waited_for_then_read_in_order(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    start = await store.head_position()
    reader = store.all_reader(start)
    async with store.pool.acquire() as slow:
        transaction = slow.transaction()
        await transaction.start()
        held = await store.append_in(slow, "test-slow", [happened(1)])  # not committed
        after = await store.append("test-fast", [happened(2)])
        assert after.positions[0] > held.positions[0]

        assert await reader.read(100) == [], "the event after the held position waits"
        assert reader.idle_delay(POLL_S) < POLL_S, "a gap is looked at again soon"
        await transaction.commit()

    events = await reader.read(100)
    assert [e.global_position for e in events] == [held.positions[0], after.positions[0]]
    assert reader.idle_delay(POLL_S) == POLL_S, "the gap is over: normal polling"
    await store.close()


async def test_a_rolled_back_position_is_given_up(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    reader = store.all_reader(await store.head_position())
    async with store.pool.acquire() as lost:
        transaction = lost.transaction()
        await transaction.start()
        await store.append_in(lost, "test-lost", [happened(1)])
        after = await store.append("test-kept", [happened(2)])
        assert await reader.read(100) == []
        await transaction.rollback()  # its position is never filled

    # Given up once no transaction older than the gap is open (on this server,
    # another test's transaction may still be: read until then).
    events = await reader.read(100)
    for _ in range(200):
        if events:
            break
        await asyncio.sleep(POLL_S)
        events = await reader.read(100)
    assert [e.global_position for e in events] == [after.positions[0]]
    assert [e.event.n for e in events] == [2]  # type: ignore[attr-defined]
    assert reader.idle_delay(POLL_S) == POLL_S
    await store.close()


async def test_contiguous_batches_are_read_whole(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    reader = store.all_reader(await store.head_position())
    written = await store.append("test-many", [happened(i) for i in range(25)])
    first = await reader.read(10)
    rest = await reader.read(100)
    positions = [e.global_position for e in (*first, *rest)]
    assert positions == list(written.positions)
    assert [e.stream_version for e in (*first, *rest)] == list(range(1, 26))
    assert await reader.read(100) == []
    await store.close()


async def test_heads_reads_where_and_what_up_to_the_head_and_waits_at_a_gap(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    reader = store.all_reader(await store.head_position())
    written = await store.append("test-heads", [happened(i) for i in range(7)])
    async with store.pool.acquire() as slow:
        transaction = slow.transaction()
        await transaction.start()
        held = await store.append_in(slow, "test-heads-held", [happened(7)])  # not committed
        after = await store.append("test-heads", [happened(8)])

        batches = [rows async for rows in reader.heads(3)]
        ours = [
            (r["stream_id"], r["stream_version"], r["global_position"], r["event_type"])
            for rows in batches
            for r in rows
            if r["stream_id"].startswith("test-heads")
        ]
        assert ours == [
            ("test-heads", v, p, "Happened") for v, p in enumerate(written.positions, start=1)
        ], "read in batches up to the held position, and no further"
        assert all(len(rows) == 3 for rows in batches[:-1])
        assert set(batches[0][0].keys()) == {
            "stream_id",
            "stream_version",
            "global_position",
            "occurred_at",
            "event_type",
        }, "no payload or metadata"
        await transaction.commit()

    rest = [r["global_position"] async for rows in reader.heads(3) for r in rows]
    assert rest == [held.positions[0], after.positions[0]]
    assert [rows async for rows in reader.heads(3)] == []
    await store.close()
