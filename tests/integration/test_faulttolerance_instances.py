"""Fault tolerance as N instances: each holds a task's events and its lines together.

Its watches (hang timers, resume and env-check waits, slowdown) need every event
and every line of a task in one process. Two instances of the service's consumer
(`runyard.faulttolerance.main.watched_tasks`) run on the real broker and Postgres,
behind the real relay, with lines keyed as the deployer keys them: each instance
holds the same partition numbers of both topics, every task's events and lines
reach one instance only, each event is handled once, the instance that gave
partitions up in the rebalance dropped the watches of exactly those, and the one
that took them took their tasks over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from runyard.contracts import Event, RecordedEvent
from runyard.contracts.loglines import LogRecord
from runyard.eventstore import PostgresEventStore
from runyard.faulttolerance.main import watched_tasks
from runyard.messaging import KafkaSettings
from runyard.messaging.consumer import make_broker
from runyard.messaging.copartition import CoPartitionedConsumer
from runyard.messaging.progress import partition_of
from runyard.messaging.topics import PARTITIONS, TASK_EVENTS

from tests.contract.sample_events import happened, sample_mapper
from tests.integration.test_relay import running_relay, wait_until
from tests.log_records import log_record

pytestmark = pytest.mark.integration

TASKS = 24  # enough that every partition gets some
EVENTS, LINES = 3, 4
WITHIN_S = 60.0


class Watcher:
    """Stands in for `FaultToleranceApp`: what reached this instance, what it dropped."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lines: list[str] = []
        self.dropped: list[str] = []
        self.adopted: list[str] = []

    async def handle(self, event: RecordedEvent[Event], conn: Any = None) -> None:
        self.events.append(event.stream_id.removeprefix("task-"))

    async def on_log(self, line: LogRecord) -> None:
        self.lines.append(line.task_id)

    def drop(self, tasks: Callable[[str], bool]) -> int:
        self.dropped += [f"t{n}" for n in range(TASKS) if tasks(f"t{n}")]
        return 0

    async def adopt(self, tasks: Callable[[str], bool]) -> int:
        self.adopted += [f"t{n}" for n in range(TASKS) if tasks(f"t{n}")]
        return 0


@contextlib.asynccontextmanager
async def instance(
    watcher: Watcher, store: PostgresEventStore, kafka: KafkaSettings
) -> AsyncIterator[CoPartitionedConsumer]:
    consumer = watched_tasks(watcher, store, kafka)  # type: ignore[arg-type]
    consumer.events.attach(make_broker(kafka), kafka.topics.task_events)
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def numbers(consumer: CoPartitionedConsumer, topic: str) -> set[int]:
    return {tp.partition for tp in consumer.assignment() if tp.topic == topic}


async def test_two_instances_each_hold_every_event_and_line_of_their_tasks(
    dsn: str, kafka: KafkaSettings
) -> None:
    store = await PostgresEventStore.connect(dsn, sample_mapper(), max_size=8)
    producer = AIOKafkaProducer(**kafka.client_options())
    await producer.start()
    first, second = Watcher(), Watcher()
    events_topic, logs_topic = kafka.topics.task_events, kafka.topics.logs
    try:
        async with instance(first, store, kafka) as a:
            await wait_until(lambda: len(a.assignment()) == 2 * PARTITIONS[TASK_EVENTS], WITHIN_S)
            async with instance(second, store, kafka) as b:
                await wait_until(lambda: a.assignment() and b.assignment(), WITHIN_S)
                await wait_until(lambda: len(a.assignment()) + len(b.assignment()) == 8, WITHIN_S)
                # The same partition numbers of both topics, none shared.
                assert numbers(a, events_topic) == numbers(a, logs_topic)
                assert numbers(b, events_topic) == numbers(b, logs_topic)
                assert not numbers(a, events_topic) & numbers(b, events_topic)
                # The first gave up the second's partitions, and dropped their watches.
                moved = numbers(b, events_topic)
                count = PARTITIONS[TASK_EVENTS]
                assert sorted(first.dropped) == sorted(
                    f"t{n}" for n in range(TASKS) if partition_of(f"task-t{n}", count) in moved
                )
                assert not second.dropped
                # Each took its tasks over when it got their partitions: the first all
                # at its start, the second those it took from the first.
                assert sorted(first.adopted) == sorted(f"t{n}" for n in range(TASKS))
                assert sorted(second.adopted) == sorted(first.dropped)

                async with running_relay(store, kafka):
                    for i in range(EVENTS):
                        for n in range(TASKS):
                            await store.append(f"task-t{n}", [happened(i)])
                    for seq in range(LINES):
                        for n in range(TASKS):
                            record = log_record(datetime.now(UTC), f"t{n}", f"step {seq}", seq=seq)
                            await producer.send(logs_topic, record.to_bytes(), key=record.key())
                    await producer.send_and_wait(logs_topic, b"not a record", key=b"task-t0")

                    def arrived() -> bool:
                        events = len(first.events) + len(second.events)
                        lines = len(first.lines) + len(second.lines)
                        return events == TASKS * EVENTS and lines == TASKS * LINES

                    await wait_until(arrived, WITHIN_S)
                    assert a.lines_malformed + b.lines_malformed == 1
    finally:
        await producer.stop()
        await store.close()

    assert first.events and second.events, "both instances took tasks"
    for n in range(TASKS):
        task = f"t{n}"
        where_events = {i for i, w in enumerate((first, second)) if task in w.events}
        where_lines = {i for i, w in enumerate((first, second)) if task in w.lines}
        assert len(where_events) == 1 and where_events == where_lines, task
        owner = (first, second)[where_events.pop()]
        assert (owner.events.count(task), owner.lines.count(task)) == (EVENTS, LINES)


async def test_events_and_lines_past_an_offset_that_outlived_the_broker_are_read(
    dsn: str, kafka: KafkaSettings
) -> None:
    """The group's committed offsets of both topics are past their ends, as after a
    broker that lost its data: the instance reads those partitions again from their
    start instead of waiting there and jumping over what was published since (no
    event comes to show the jump: the broker answers such fetches with nothing)."""
    store = await PostgresEventStore.connect(dsn, sample_mapper(), max_size=8)
    watcher = Watcher()
    topics = (kafka.topics.task_events, kafka.topics.logs)
    try:
        group = watched_tasks(watcher, store, kafka).events.group_id  # type: ignore[arg-type]
        ahead = AIOKafkaConsumer(**kafka.client_options(), group_id=group)
        await ahead.start()
        try:
            every = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS[TASK_EVENTS])]
            ahead.assign(every)
            await ahead.commit({tp: 100 for tp in every})
        finally:
            await ahead.stop()
        producer = AIOKafkaProducer(**kafka.client_options())
        await producer.start()
        try:
            for n in range(TASKS):
                record = log_record(datetime.now(UTC), f"t{n}", "step 0", seq=0)
                await producer.send(kafka.topics.logs, record.to_bytes(), key=record.key())
            await producer.flush()
        finally:
            await producer.stop()
        async with running_relay(store, kafka), instance(watcher, store, kafka) as reader:
            for n in range(TASKS):
                await store.append(f"task-t{n}", [happened(0)])
            await wait_until(lambda: len(watcher.lines) >= TASKS, WITHIN_S)
            await wait_until(lambda: len(watcher.events) >= TASKS, WITHIN_S)
            assert reader.events.stats.rewinds >= 1
        assert sorted(set(watcher.lines)) == sorted(f"t{n}" for n in range(TASKS))
        assert sorted(watcher.events) == sorted(f"t{n}" for n in range(TASKS))
    finally:
        await store.close()
