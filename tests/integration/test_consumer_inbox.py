"""The consumer's inbox over a real Postgres and broker: one statement records a
batch's events, each new one is handled once, a duplicate in the batch or a
redelivery is skipped, and an event whose handler fails is dead-lettered with
its inbox row (and, for an isolated handler, its writes) rolled back, so a
retried dead letter is handled again."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from aiokafka.structs import ConsumerRecord
from runyard.contracts import Event, RecordedEvent
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings, codec
from runyard.messaging.consumer import IdempotentConsumer, make_broker

from tests.contract.sample_events import happened, sample_mapper

pytestmark = pytest.mark.integration


def consumer_record(
    event: RecordedEvent[Event], offset: int, partition: int = 0
) -> ConsumerRecord[bytes, bytes]:
    """The message the relay would publish for `event`, as a consumer polls it."""
    key, value, headers = codec.encode(event)
    return ConsumerRecord(
        topic="test",
        partition=partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=len(key),
        serialized_value_size=len(value),
        headers=headers,
    )


@pytest.mark.parametrize("isolated", [True, False])
async def test_a_batch_is_recorded_once_and_a_failed_event_can_be_handled_again(
    dsn: str, kafka: KafkaSettings, isolated: bool
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper())
    stream = f"test-{uuid.uuid4().hex[:8]}"
    await store.append(stream, [happened(n) for n in (1, 2, 3)])
    one, two, three = await store.read_stream(stream)
    await store.pool.execute("CREATE TABLE IF NOT EXISTS inbox_effects (name text, n int)")
    name = f"inbox-{'isolated' if isolated else 'shared'}-{uuid.uuid4().hex[:6]}"
    handled: list[int] = []
    failing = {2}

    async def handler(event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
        n = event.event.n  # type: ignore[attr-defined]
        if isolated:
            await conn.execute("INSERT INTO inbox_effects VALUES ($1, $2)", name, n)
        if n in failing:
            raise ValueError(f"cannot handle {n}")
        handled.append(n)

    broker = make_broker(kafka)
    consumer = IdempotentConsumer(
        name,
        pool=store.pool,
        mapper=sample_mapper(),
        handler=handler,
        kafka=kafka,
        isolated=isolated,
    )
    consumer.attach(broker, "test")
    await broker.connect()
    try:
        # 3 comes twice in the batch (a redelivery inside one fetch).
        batch = [consumer_record(e, i) for i, e in enumerate((one, two, three, three))]
        await consumer.process_batch(batch)
        assert handled == [1, 3]
        assert (consumer.stats.processed, consumer.stats.duplicates) == (2, 1)
        assert consumer.stats.dead_lettered == 1
        inbox = await store.pool.fetch("SELECT event_id FROM inbox WHERE consumer = $1", name)
        assert {r["event_id"] for r in inbox} == {one.event_id, three.event_id}
        if isolated:
            effects = await store.pool.fetch(
                "SELECT n FROM inbox_effects WHERE name = $1 ORDER BY n", name
            )
            assert [r["n"] for r in effects] == [1, 3], "the failed event's write rolled back"

        # The cause is fixed and the dead letter retried: 2 is handled now, 1 is not again.
        failing.clear()
        await consumer.process_batch([consumer_record(two, 4), consumer_record(one, 5)])
        assert handled == [1, 3, 2]
        assert (consumer.stats.processed, consumer.stats.duplicates) == (3, 2)
    finally:
        await broker.stop()
        await store.close()
