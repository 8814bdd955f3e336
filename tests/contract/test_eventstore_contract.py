"""One contract, every event store: the same tests run on each implementation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from runyard.contracts import Metadata, NewEvent, utcnow
from runyard.eventstore import (
    ANY,
    NO_STREAM,
    AppendRequest,
    ConcurrencyError,
    DuplicateEventError,
    EventStore,
    InMemoryEventStore,
    PostgresEventStore,
    eventstore_migrations,
)

from tests.conftest import fresh_database
from tests.contract.sample_events import Happened, Renamed, happened, sample_mapper


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest, postgres_url: str) -> AsyncIterator[EventStore]:
    if request.param == "memory":
        yield InMemoryEventStore(sample_mapper())
        return
    async with fresh_database(postgres_url) as dsn:
        pg = await PostgresEventStore.connect(dsn, sample_mapper())
        yield pg
        await pg.close()


async def test_append_and_read_a_stream(store: EventStore) -> None:
    result = await store.append("test-1", [happened(1), happened(2)], NO_STREAM)
    assert result.version == 2
    assert len(result.positions) == 2 and result.positions[0] < result.positions[1]
    events = await store.read_stream("test-1")
    assert [e.event for e in events] == [Happened(n=1), Happened(n=2)]
    assert [e.stream_version for e in events] == [1, 2]
    assert events[0].metadata.actor == "user:acme/alice"
    assert events[0].metadata.correlation_id == "corr-1"
    assert events[0].occurred_at.tzinfo is not None
    assert await store.stream_version("test-1") == 2
    assert await store.stream_version("test-none") == 0


async def test_read_stream_from_a_version(store: EventStore) -> None:
    await store.append("test-1", [happened(i) for i in range(5)])
    tail = await store.read_stream("test-1", from_version=4)
    assert [e.stream_version for e in tail] == [4, 5]


async def test_holds_an_event_only_as_stored(store: EventStore) -> None:
    import uuid

    from runyard.contracts import RecordedEvent

    await store.append("test-1", [happened(i) for i in range(3)])
    stored = (await store.read_stream("test-1", from_version=2, limit=1))[0]
    assert await store.holds(stored)

    def like(event_id: uuid.UUID, version: int, n: int) -> RecordedEvent[Happened]:
        return RecordedEvent(
            event_id, "test-1", version, stored.global_position, stored.occurred_at,
            Happened(n=n), stored.metadata,
        )  # fmt: skip

    assert await store.holds(like(stored.event_id, 2, 1))  # the stored payload, rebuilt
    assert not await store.holds(like(stored.event_id, 2, 99))  # another payload
    assert not await store.holds(like(uuid.uuid4(), 2, 1))  # another id
    assert not await store.holds(like(stored.event_id, 4, 1))  # past the stream's end


async def test_read_stream_a_page_at_a_time(store: EventStore) -> None:
    await store.append("test-1", [happened(i) for i in range(5)])
    page = await store.read_stream("test-1", from_version=2, limit=2)
    assert [e.stream_version for e in page] == [2, 3]
    assert [e.stream_version for e in await store.read_stream("test-1", 5, limit=10)] == [5]
    assert await store.read_stream("test-1", 6, limit=1) == []


async def test_exact_expected_version(store: EventStore) -> None:
    await store.append("test-1", [happened(1)], NO_STREAM)
    result = await store.append("test-1", [happened(2)], 1)
    assert result.version == 2


async def test_wrong_expected_version_raises_with_details(store: EventStore) -> None:
    await store.append("test-1", [happened(1), happened(2)])
    with pytest.raises(ConcurrencyError) as info:
        await store.append("test-1", [happened(3)], 1)
    assert (info.value.stream_id, info.value.expected, info.value.actual) == ("test-1", 1, 2)
    assert info.value.retryable
    with pytest.raises(ConcurrencyError) as info:
        await store.append("test-1", [happened(3)], NO_STREAM)
    assert info.value.actual == 2
    with pytest.raises(ConcurrencyError) as info:
        await store.append("test-2", [happened(3)], 4)
    assert info.value.actual is None
    assert await store.stream_version("test-1") == 2
    assert await store.stream_version("test-2") == 0


async def test_concurrent_writers_one_wins(store: EventStore) -> None:
    await store.append("test-1", [happened(0)])
    outcomes = await asyncio.gather(
        *(store.append("test-1", [happened(i)], 1) for i in range(5)), return_exceptions=True
    )
    assert sum(not isinstance(o, Exception) for o in outcomes) == 1
    assert all(isinstance(o, ConcurrencyError) for o in outcomes if isinstance(o, Exception))
    assert await store.stream_version("test-1") == 2


async def test_reappending_the_same_events_is_idempotent(store: EventStore) -> None:
    events = [happened(1), happened(2)]
    first = await store.append("test-1", events, NO_STREAM)
    again = await store.append("test-1", events, NO_STREAM)
    assert again == first
    with_any = await store.append("test-1", events, ANY)
    assert with_any == first
    assert len(await store.read_stream("test-1")) == 2


async def test_replaying_a_multi_stream_append_is_idempotent(store: EventStore) -> None:
    requests = [AppendRequest("test-a", [happened(1)]), AppendRequest("test-b", [happened(2)])]
    first = await store.append_many(requests)
    assert await store.append_many(requests) == first
    assert await store.stream_version("test-a") == 1
    assert await store.stream_version("test-b") == 1
    mixed = [
        AppendRequest("test-a", list(requests[0].events)),
        AppendRequest("test-c", [happened(3)]),
    ]
    with pytest.raises(DuplicateEventError):
        await store.append_many(mixed)
    assert await store.stream_version("test-c") == 0


async def test_reusing_an_event_id_elsewhere_is_refused(store: EventStore) -> None:
    event = happened(1)
    await store.append("test-1", [event])
    with pytest.raises(DuplicateEventError):
        await store.append("test-2", [event])
    with pytest.raises(DuplicateEventError):
        await store.append("test-1", [event, happened(2)])
    assert await store.stream_version("test-2") == 0


async def test_multi_stream_append_is_all_or_nothing(store: EventStore) -> None:
    await store.append("test-a", [happened(1)])
    with pytest.raises(ConcurrencyError):
        await store.append_many(
            [
                AppendRequest("test-b", [happened(2)], NO_STREAM),
                AppendRequest("test-a", [happened(3)], 5),
            ]
        )
    assert await store.stream_version("test-b") == 0
    results = await store.append_many(
        [
            AppendRequest("test-b", [happened(2)], NO_STREAM),
            AppendRequest("test-a", [happened(3)], 1),
        ]
    )
    assert [r.version for r in results] == [1, 2]


async def test_read_all_in_global_order(store: EventStore) -> None:
    for i in range(10):
        await store.append(f"test-{i % 3}", [happened(i)])
    reader = store.all_reader(0)
    first = await reader.read(4)
    rest = await reader.read(100)
    positions = [e.global_position for e in first + rest]
    assert positions == sorted(positions) and len(positions) == 10
    assert [e.event.n for e in first + rest] == list(range(10))  # type: ignore[attr-defined]
    assert await reader.read(10) == []
    assert await store.head_position() == positions[-1]
    later = store.all_reader(positions[4])
    assert [e.global_position for e in await later.read(100)] == positions[5:]


async def test_subscription_catches_up_then_goes_live(store: EventStore) -> None:
    await store.append("test-1", [happened(1)])
    seen: list[int] = []

    async def follow() -> None:
        async for event in store.subscribe_all(0, poll_interval=0.001):
            seen.append(event.event.n)  # type: ignore[attr-defined]
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    await store.append("test-2", [happened(2), happened(3)])
    await asyncio.wait_for(task, 5)
    assert seen == [1, 2, 3]


def test_naive_datetime_is_refused() -> None:
    from datetime import datetime

    with pytest.raises(ValueError, match="timezone-aware"):
        NewEvent(Happened(n=1), Metadata(actor="t"), occurred_at=datetime(2026, 1, 1))


async def test_old_event_versions_load_through_the_upcaster(dsn: str) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    try:
        await store.pool.execute(
            """INSERT INTO events (event_id, stream_id, stream_version, event_type,
                   schema_version, data, metadata, occurred_at)
               VALUES (gen_random_uuid(), 'test-old', 1, 'Renamed', 1, $1, $2, now())""",
            json.dumps({"name": "Ada Lovelace"}),
            json.dumps({"actor": "user:acme/ada"}),
        )
        [old] = await store.read_stream("test-old")
        assert old.event == Renamed(first="Ada", last="Lovelace")
    finally:
        await store.close()


async def test_a_read_decodes_old_and_current_rows_alike_and_refuses_an_unknown_type(
    dsn: str,
) -> None:
    """Rows of a current payload are decoded inline by the readers; every other row
    (an older version, a type this code does not know) goes through `decode`."""
    from runyard.contracts import UnknownEventType

    store = await PostgresEventStore.connect(dsn, sample_mapper())

    async def insert(version: int, type_name: str, schema_version: int, data: str) -> None:
        """A row as an older Runyard (or a newer one) wrote it."""
        async with store.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO events (event_id, stream_id, stream_version, event_type,
                       schema_version, data, metadata, occurred_at)
                   VALUES (gen_random_uuid(), 'test-mix', $1, $2, $3, $4,
                           '{"actor": "t"}', now())""",
                version,
                type_name,
                schema_version,
                data,
            )
            await conn.execute(
                """INSERT INTO streams (stream_id, version) VALUES ('test-mix', $1)
                   ON CONFLICT (stream_id) DO UPDATE SET version = $1""",
                version,
            )

    renamed = NewEvent(Renamed(first="Grace", last="Hopper"), Metadata(actor="t"), utcnow())
    try:
        await insert(1, "Renamed", 1, '{"name": "Ada Lovelace"}')
        await store.append("test-mix", [renamed], 1)
        await insert(3, "Renamed", 1, '{"name": "Alan Turing"}')
        await store.append("test-mix", [happened(4)], 3)
        want = [
            Renamed(first="Ada", last="Lovelace"),
            Renamed(first="Grace", last="Hopper"),
            Renamed(first="Alan", last="Turing"),
            Happened(n=4),
        ]
        assert [e.event for e in await store.read_stream("test-mix")] == want
        assert [e.event for e in await store.all_reader(0).read(10)] == want
        assert [e.stream_version for e in await store.read_stream("test-mix")] == [1, 2, 3, 4]

        await insert(5, "Vanished", 1, "{}")
        with pytest.raises(UnknownEventType, match="Vanished"):
            await store.read_stream("test-mix")
        with pytest.raises(UnknownEventType, match="Vanished"):
            await store.all_reader(0).read(10)
    finally:
        await store.close()


async def test_migrations_are_idempotent(dsn: str) -> None:
    first = await PostgresEventStore.connect(dsn, sample_mapper())
    second = await PostgresEventStore.connect(dsn, sample_mapper())
    rows = await second.pool.fetchval("SELECT count(*) FROM schema_migrations")
    assert rows == len(eventstore_migrations())
    await first.close()
    await second.close()


async def test_driver_errors_become_store_errors() -> None:
    from runyard.eventstore import StoreUnavailable

    with pytest.raises(StoreUnavailable):
        await PostgresEventStore.connect("postgresql://postgres@127.0.0.1:1/none", sample_mapper())


def test_bad_expected_version_is_a_clear_error() -> None:
    store = InMemoryEventStore()
    with pytest.raises(ValueError, match="expected version"):
        asyncio.run(store.append("test-1", [happened(1)], -5))
