"""Stateless consumers as N instances of one group on the real broker and Postgres.

Two instances share a multi-partition topic; one of them stops while messages
still flow, having committed no offset at all (the worst case: a crash right
after its transactions), so every partition it held is read again by the other.
Every log line is still stored once, and every event is still handled once:
the log store's dedupe key and the consumer's inbox absorb the redelivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from runyard.contracts import Event, RecordedEvent
from runyard.eventstore import PostgresEventStore
from runyard.logs import LogIngester, LogStore
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.messaging.batches import LogBatchConsumer
from runyard.messaging.consumer import IdempotentConsumer, make_broker
from runyard.messaging.topics import LOGS, PARTITIONS, TASK_EVENTS

from tests.conftest import quick_groups
from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import running_relay, wait_until
from tests.log_records import log_record

pytestmark = pytest.mark.integration

TASKS = 24  # message keys: enough that every partition gets some
WITHIN_S = 60.0


@pytest.fixture
def kafka(kafka: KafkaSettings) -> KafkaSettings:
    """Two members of one group share its partitions, and one takes over from the
    other (`quick_groups`)."""
    return quick_groups(kafka)


async def _partitions(kafka: KafkaSettings, topic: str) -> int:
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        await admin.close()


async def _create_topic(kafka: KafkaSettings, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def test_topics_have_partitions_for_several_instances(kafka: KafkaSettings) -> None:
    """What instances share is partitions: the topics scaled consumers read have several."""
    assert await _partitions(kafka, kafka.topics.logs) == PARTITIONS[LOGS] >= 2
    assert await _partitions(kafka, kafka.topics.task_events) == PARTITIONS[TASK_EVENTS] >= 2


async def test_a_topic_with_too_few_partitions_is_reported(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Found as an older release (or a broker's auto-creation) left it: said, not changed."""
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await _create_topic(KafkaSettings(bootstrap=kafka_bootstrap), topics.logs, 1)
    with caplog.at_level(logging.WARNING, "runyard.messaging"):
        created = await ensure_topics(kafka_bootstrap, topics)
    assert topics.logs not in created and topics.task_events in created
    assert f"topic {topics.logs} has 1 partitions, not {PARTITIONS[LOGS]}" in caplog.text
    assert topics.task_events not in caplog.text


# --- log ingesters -------------------------------------------------------------------


class NeverCommits(LogBatchConsumer):
    """Hands what it reads to its handler but never commits an offset."""

    async def _commit(self, consumer: Any, offsets: Any) -> None:
        return None


def crashing_ingester(store: LogStore, kafka: KafkaSettings, max_records: int) -> LogIngester:
    """An ingester that stores what it reads but never commits an offset: stopped, it
    leaves every line it stored to be read again by whoever takes its partitions."""
    ingester = LogIngester(store, kafka, max_records=max_records)
    ingester.consumer = NeverCommits(
        ingester.group, kafka=kafka, handler=ingester.ingest, max_records=max_records
    )
    return ingester


def _log_line(task: int, seq: int) -> bytes:
    record = log_record(datetime.now(UTC), f"task-{task}", f"step {seq} of task {task}", seq=seq)
    return record.to_bytes()


@contextlib.asynccontextmanager
async def running(*runs: Callable[[], Any]) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(run()) for run in runs]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stored(pool: asyncpg.Pool) -> tuple[int, int]:
    """(rows, distinct lines) in the log store."""
    row = await pool.fetchrow(
        "SELECT count(*) AS n, count(DISTINCT (task_id, seq)) AS d FROM log_lines"
    )
    return int(row["n"]), int(row["d"])


async def test_two_log_ingesters_share_partitions_and_store_each_line_once(
    dsn: str, kafka: KafkaSettings
) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    store = LogStore(pool)
    await store.migrate()
    await store.maintain(datetime.now(UTC))
    first = crashing_ingester(store, kafka, max_records=50)
    second = LogIngester(store, kafka, max_records=50)
    per_task = 25
    total = TASKS * per_task
    try:
        async with running(first.run, second.run) as (first_task, _):
            await wait_until(lambda: first.assignment() and second.assignment(), WITHIN_S)
            assert not first.assignment() & second.assignment()

            stopped = asyncio.Event()

            async def publish() -> None:
                for seq in range(per_task):
                    if seq == per_task // 2:
                        await stopped.wait()  # the rest flows once the first instance is gone
                    for task in range(TASKS):
                        key = f"task-{task}".encode()
                        await producer.send(kafka.topics.logs, _log_line(task, seq), key=key)
                    await producer.flush()
                    await asyncio.sleep(0.01)  # a stream, not a burst

            publishing = asyncio.create_task(publish())
            # Both instances store lines, then one stops while lines still flow.
            await wait_until(lambda: first.stats.stored > 0 and second.stats.stored > 0, WITHIN_S)
            first_task.cancel()
            await asyncio.gather(first_task, return_exceptions=True)
            stopped.set()
            await publishing
            stored_by_first = first.stats.stored

            # The survivor takes every partition, reads the stopped one's lines again
            # (it committed nothing) and stores none of them twice.
            async def caught_up() -> bool:
                rows, _ = await _stored(pool)
                return rows == total and second.stats.duplicates >= stored_by_first

            await _wait_async(caught_up)
            assert len(second.assignment()) == await _partitions(kafka, kafka.topics.logs)
        rows, distinct = await _stored(pool)
        assert (rows, distinct) == (total, total)
        # (The instances' own counts need not add up: a batch whose insert committed
        # as its instance was cancelled is stored but was not counted by it.)
    finally:
        await producer.stop()
        await pool.close()


async def _wait_async(condition: Callable[[], Any], within: float = WITHIN_S) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# --- idempotent consumers ------------------------------------------------------------


class CrashingConsumer(IdempotentConsumer):
    """Handles and commits its transactions but never an offset (see the module)."""

    async def _commit(self, message: Any) -> None:
        return None


class Recorder:
    """A handler that writes one row per call in the consumer's transaction: a
    committed second handling of an event would show as a second row."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.calls = 0

    async def __call__(self, event: RecordedEvent[Event], conn: asyncpg.Connection) -> None:
        await conn.execute(
            "INSERT INTO handled (event_id, instance) VALUES ($1, $2)",
            event.event_id,
            self.instance,
        )
        self.calls += 1


@contextlib.asynccontextmanager
async def consumer_instance(
    kind: type[IdempotentConsumer], dsn: str, kafka: KafkaSettings, instance: str
) -> AsyncIterator[tuple[IdempotentConsumer, Any]]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    broker = make_broker(kafka)
    consumer = kind(
        "scaled", pool=pool, mapper=sample_mapper(), handler=Recorder(instance), kafka=kafka
    )
    consumer.subscribe(broker, kafka.topics.for_category("test"))
    try:
        yield consumer, broker
    finally:
        with contextlib.suppress(Exception):
            await broker.stop()
        await pool.close()


async def test_two_consumers_of_one_group_handle_each_event_once(
    dsn: str, kafka: KafkaSettings
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper(), max_size=8)
    await store.pool.execute(
        "CREATE TABLE handled (event_id uuid NOT NULL, instance text NOT NULL)"
    )
    topic = kafka.topics.for_category("test")
    await _create_topic(kafka, topic, 4)
    per_stream = 15
    total = TASKS * per_stream
    try:
        async with (
            consumer_instance(CrashingConsumer, dsn, kafka, "a") as (first, first_broker),
            consumer_instance(IdempotentConsumer, dsn, kafka, "b") as (second, second_broker),
        ):
            await asyncio.gather(first_broker.start(), second_broker.start())
            await wait_until(lambda: first.assignment() and second.assignment(), WITHIN_S)
            assert not first.assignment() & second.assignment()

            stopped = asyncio.Event()

            async def append() -> None:
                for i in range(per_stream):
                    if i == per_stream // 2:
                        await stopped.wait()  # the rest flows once the first instance is gone
                    for stream in range(TASKS):
                        await store.append(f"test-{stream}", [happened(i)])
                    await asyncio.sleep(0.01)

            async with running_relay(store, kafka):
                appending = asyncio.create_task(append())
                await wait_until(
                    lambda: first.handler.calls > 0 and second.handler.calls > 0,  # type: ignore[attr-defined]
                    WITHIN_S,
                )
                await first_broker.stop()
                stopped.set()
                await appending
                by_first = await store.pool.fetchval(
                    "SELECT count(*) FROM handled WHERE instance = 'a'"
                )

                async def caught_up() -> bool:
                    rows: int = await store.pool.fetchval("SELECT count(*) FROM handled")
                    return rows == total and second.stats.duplicates >= by_first

                await _wait_async(caught_up)
                held = second.assignment()
                assert held == {TopicPartition(topic, p) for p in range(4)}
        rows = await store.pool.fetch("SELECT event_id, count(*) AS n FROM handled GROUP BY 1")
        assert len(rows) == total
        assert all(r["n"] == 1 for r in rows)
        assert by_first > 0
        inbox = await store.pool.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'scaled'")
        assert inbox == total
    finally:
        await store.close()
